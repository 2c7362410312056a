#!/usr/bin/env python3
"""A snapshot saved with torch.save (argv: sympool, a snapshot pickle, work dir).

torch.save(torch.cuda.memory._snapshot(), path) writes a zip archive: PyTorch's writer
(caffe2/serialize/inline_container.cc) uses miniz with ZIP64 records always
(MZ_ZIP_FLAG_WRITE_ZIP64), stores every member uncompressed, pads each member's data to 64 bytes
with an extra field in its local header, and names the pickle NAME/data.pkl beside NAME/version,
NAME/byteorder and NAME/.data/serialization_id. A snapshot holds no tensor, so data.pkl is the
snapshot's whole pickle (protocol 2, torch.save's default). The archive is written here field by
field as that writer lays it out (PKWARE's APPNOTE.TXT), and Python's zipfile writes a second
one (no ZIP64 records, no padding). Every command reads both as it reads the pickle itself: the
same output once the path is named alike; info names the member. Archives that are not a
snapshot saved so are refused with one line saying what they are: a data.pkl that is compressed,
none, two, a truncated archive, and a data.pkl holding a tensor (a checkpoint) or no snapshot,
said of the member. An archive through a pipe ("-") is read as from its file. So is a file in
torch.save's old format (before torch 1.6: pickles one after another), in every protocol; one
whose header is not that format's is refused with what is wrong in it."""
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile
import zlib

cli, trace, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
fails = []
with open(trace, "rb") as f:
    snapshot = pickle.load(f)


def torch_zip(members, pad_to=64, cd_zip64=False):
    """members: [(name, bytes)]: a ZIP64 archive as miniz writes it with
    MZ_ZIP_FLAG_WRITE_ZIP64 (sizes and offsets in the ZIP64 extra field of the local headers,
    32-bit ones in the central directory while they fit; ZIP64 end record and locator)."""
    out, central = bytearray(), bytearray()
    for name, data in members:
        nb = name.encode()
        crc = zlib.crc32(data)
        local_ofs = len(out)
        z64 = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        header_len = 30 + len(nb) + len(z64)
        pad = (-(local_ofs + header_len + 4)) % pad_to
        extra = z64 + struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # "FB": the padding
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0x21, crc,
                           0xFFFFFFFF, 0xFFFFFFFF, len(nb), len(extra)) + nb + extra + data
        if cd_zip64:  # as for a member past 4 GiB: every field in the ZIP64 extra field
            x = struct.pack("<HHQQQ", 1, 24, len(data), len(data), local_ofs)
            central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0x21, crc,
                                   0xFFFFFFFF, 0xFFFFFFFF, len(nb), len(x), 0, 0, 0, 0,
                                   0xFFFFFFFF) + nb + x
        else:
            central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0x21, crc,
                                   len(data), len(data), len(nb), 0, 0, 0, 0, 0, local_ofs) + nb
    cd_ofs, n = len(out), len(members)
    out += central
    z64_ofs = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_ofs)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64_ofs, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def torch_members(name, pkl):
    return [(f"{name}/data.pkl", pkl), (f"{name}/byteorder", b"little"),
            (f"{name}/version", b"3\n"), (f"{name}/.data/serialization_id", b"0" * 40)]


def write(name, data):
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def run(*args):
    return subprocess.run([cli, *args], capture_output=True, text=True,
                          env=dict(os.environ, SYMPOOL_DEVICE="host"))


def normal(text, path):
    if text.startswith("{"):  # --json: the trace's name, the time and the member left out
        doc = json.loads(text)
        doc.pop("trace", None)
        doc.pop("ns_per_event", None)
        doc.get("format", {}).pop("zip_member", None)
        return doc
    text = text.replace(path, "INPUT")
    text = re.sub(r'"ns_per_event":[0-9.e+-]+', "", text)
    return "\n".join(l for l in text.splitlines()
                     if "time per event" not in l and not l.startswith("format:")
                     and "snapshot " not in l[:40])


def zip_member_of(path):
    """info --json's format.zip_member, or "(refused)" when info does not read the file."""
    r = run("info", "--json", path)
    return json.loads(r.stdout)["format"].get("zip_member") if r.returncode == 0 else "(refused)"


pkl = pickle.dumps(snapshot, protocol=2)
plain = write("plain.pickle", pkl)
zbuf = io.BytesIO()
with zipfile.ZipFile(zbuf, "w") as z:
    for name, data in torch_members("py", pkl):
        z.writestr(name, data)
archives = {"torch": write("torch.pt", torch_zip(torch_members("torch", pkl))),
            "torch64": write("torch64.pt", torch_zip(torch_members("torch", pkl), cd_zip64=True)),
            "zipfile": write("zipfile.pt", zbuf.getvalue())}
for kind, path in archives.items():
    member = ("py" if kind == "zipfile" else "torch") + "/data.pkl"
    for args in (["info"], ["info", "--json"], ["replay", "--json"], ["replay"], ["summary"]):
        a, b = run(*args, plain), run(*args, path)
        if a.returncode != 0 or b.returncode != 0 or normal(a.stdout, plain) != normal(
                b.stdout, path):
            fails.append(f"{kind} {' '.join(args)}: rc {a.returncode}/{b.returncode}\n"
                         f"{a.stdout[:600]}\n---\n{b.stdout[:600]}{b.stderr}")
    info = run("info", path).stdout
    if f"the {member} of a torch.save zip archive" not in info:
        fails.append(f"{kind}: info does not name the member: {info[:300]}")
    got = zip_member_of(path)
    if got != member:
        fails.append(f"{kind}: info --json's zip_member is {got!r}, not {member}")
    svg_a, svg_b = os.path.join(work, "a.svg"), os.path.join(work, kind + ".svg")
    pa, pb = run("plot", plain, "-o", svg_a), run("plot", path, "-o", svg_b)
    if pb.returncode != 0 or pa.stdout.replace(svg_a, "OUT") != pb.stdout.replace(svg_b, "OUT"):
        fails.append(f"{kind} plot: {pb.stdout}{pb.stderr} / {pa.stdout}")
# Through a pipe ("-"): read to its end, where the archive's directory is (a stream was
# refused at its first byte, PERSID to the pickle reader).
with open(archives["torch"], "rb") as f:
    piped = subprocess.run([cli, "replay", "--json", "-"], stdin=f, capture_output=True,
                           text=True, env=dict(os.environ, SYMPOOL_DEVICE="host"))
direct = run("replay", "--json", plain)
if piped.returncode != 0 or normal(piped.stdout, "-") != normal(direct.stdout, plain):
    fails.append(f"torch archive through a pipe: rc {piped.returncode}: {piped.stderr}")
if zip_member_of(plain) is not None:
    fails.append("a plain pickle: info --json's zip_member is not null")


def refused(what, path, needle):
    r = run("replay", path)
    lines = r.stderr.splitlines()
    if r.returncode != 1 or len(lines) != 1 or needle not in lines[0] or r.stdout:
        fails.append(f"{what}: rc {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}")


deflated = io.BytesIO()
with zipfile.ZipFile(deflated, "w", compression=zipfile.ZIP_DEFLATED) as z:
    z.writestr("archive/data.pkl", pkl)
refused("a compressed data.pkl", write("deflated.pt", deflated.getvalue()),
        "its archive/data.pkl is compressed (zip method 8)")
refused("no data.pkl", write("none.pt", torch_zip([("archive/version", b"3\n")])),
        "it has no NAME/data.pkl member")
refused("a data.pkl deeper than NAME/", write("deep.pt", torch_zip([("a/b/data.pkl", pkl)])),
        "it has no NAME/data.pkl member")
refused("two data.pkl", write("two.pt", torch_zip([("a/data.pkl", pkl), ("b/data.pkl", pkl)])),
        "it has 2 NAME/data.pkl members")
whole = torch_zip(torch_members("archive", pkl))
refused("a truncated archive", write("cut.pt", whole[:len(whole) // 2]),
        "a zip archive (what torch.save writes), but it has no end of central directory record")
# A checkpoint: its tensors are persistent ids (BINPERSID) in data.pkl.
ckpt = b"\x80\x02}q\x00X\x06\x00\x00\x00weightq\x01X\x01\x00\x00\x000Qs."
refused("a checkpoint", write("ckpt.pt", torch_zip(torch_members("archive", ckpt))),
        "the pickle torch.save wrote (archive/data.pkl): ")
# Inside an archive, what is no snapshot is said of its member: no pickle at all, a pickle of
# something else.
refused("a data.pkl that is no pickle", write("text.pt", torch_zip(torch_members("archive",
        b"\x07junk"))), "the pickle torch.save wrote (archive/data.pkl): not a pickle")
refused("a data.pkl holding a number", write("number.pt", torch_zip(torch_members("archive",
        pickle.dumps(7, protocol=2)))), "the pickle torch.save wrote (archive/data.pkl): not a "
        "memory snapshot")

# torch.save's old format (every torch before 1.6; _use_new_zipfile_serialization=False since):
# no zip, but pickles one after another, each of torch.save's pickle_protocol (torch's
# serialization.py, _legacy_save): the magic number 0x1950a86a20f9469cfc6c, the format's
# version 1001, the writer's sys_info, the object, the storage keys (none: no tensor).
MAGIC = 0x1950A86A20F9469CFC6C
SYS_INFO = dict(protocol_version=1001, little_endian=True,
                type_sizes=dict(short=2, int=4, long=8))


def legacy(obj, proto, version=1001, sys_info=SYS_INFO):
    return b"".join(pickle.dumps(v, protocol=proto)
                    for v in (MAGIC, version, sys_info, obj, []))


for proto in range(6):
    pp = write(f"plain-p{proto}.pickle", pickle.dumps(snapshot, protocol=proto))
    lp = write(f"legacy-p{proto}.pt", legacy(snapshot, proto))
    for args in (["info", "--json"], ["replay", "--json"], ["summary"]):
        a, b = run(*args, pp), run(*args, lp)
        na, nb = normal(a.stdout, pp), normal(b.stdout, lp)
        if isinstance(nb, dict):
            nb.get("format", {}).pop("legacy_torch_save", None)
            na.get("format", {}).pop("legacy_torch_save", None)
        if a.returncode != 0 or b.returncode != 0 or na != nb:
            fails.append(f"old format, protocol {proto}, {' '.join(args)}: rc "
                         f"{a.returncode}/{b.returncode}: {b.stderr[:300]}")
    r = run("info", "--json", lp)
    fmt = json.loads(r.stdout)["format"] if r.returncode == 0 else {}
    if fmt.get("legacy_torch_save") is not True or fmt.get("pickle_protocol") != proto:
        fails.append(f"old format, protocol {proto}: info --json's format is {fmt}")
    if "the object of a file in torch.save's old format" not in run("info", lp).stdout:
        fails.append(f"old format, protocol {proto}: info does not say what the file is")
r = run("info", "--json", plain)
if r.returncode != 0 or json.loads(r.stdout)["format"].get("legacy_torch_save") is not False:
    fails.append("a plain pickle: info --json's legacy_torch_save is not false")
with open(os.path.join(work, "legacy-p2.pt"), "rb") as f:
    piped = subprocess.run([cli, "replay", "--json", "-"], stdin=f, capture_output=True,
                           text=True, env=dict(os.environ, SYMPOOL_DEVICE="host"))
if piped.returncode != 0 or normal(piped.stdout, "-") != normal(direct.stdout, plain):
    fails.append(f"old format through a pipe: rc {piped.returncode}: {piped.stderr}")
header = legacy(snapshot, 2)
head_len = len(header) - len(pickle.dumps(snapshot, protocol=2)) - len(pickle.dumps([], 2))
refused("old format, another version", write("v1000.pt", legacy(snapshot, 2, version=1000)),
        "torch.save's old format (before torch 1.6), but its format version (pickle 2, at offset "
        "15) is not 1001")
refused("old format, sys_info no dict", write("sysinfo.pt", legacy(snapshot, 2, sys_info=[1])),
        "its sys_info (pickle 3, at offset 21) is not a dict")
refused("old format, sys_info unreadable", write("sysbad.pt", header[:21] + b"\x80\x02h\x05."
        + pickle.dumps(snapshot, protocol=2)), "its sys_info (pickle 3, at offset 21) does not "
        "read: pickle: memo key 5 is not defined")
refused("old format, header only", write("head.pt", header[:head_len]),
        f"it ends after its header (at offset {head_len}): no object follows")
refused("old format, cut in its header", write("headcut.pt", header[:25]),
        "its sys_info (pickle 3, at offset 21) has no STOP")
refused("old format, no snapshot inside", write("list.pt", legacy([1, 2], 2)),
        "the pickle torch.save wrote (its old format, before torch 1.6): not a memory snapshot")
# The magic number alone is a pickle of an int, as before: not taken for the old format.
refused("the magic number alone", write("magic.pickle", pickle.dumps(MAGIC, protocol=2)),
        "torch.save's old format (before torch 1.6), but its format version (pickle 2, at offset "
        "15) has no STOP")

if fails:
    sys.exit("torch.save archives:\n  " + "\n  ".join(fails))
print("torch save ok")
