#!/usr/bin/env python3
"""probe.py --out FILE [--snap DIR]: facts only a GPU with PyTorch decides, asked once per GPU
session (the questions earlier sessions' notes left open), and what memory history costs in
PyTorch and in sympool measured in the same process:

  context      whether cudaStreamIsCapturing(NULL) makes the primary context of a device that had
               none (a fresh process; the driver's cuDevicePrimaryCtxGetState before and after)
  reserve      whether cuMemAddressReserve with alignment 0 returns a base aligned to the
               allocation granularity (sympool and PyTorch pass 0; NCCL passes the granularity)
  bus_id       cudaDeviceGetPCIBusId of the one GPU named by index and by UUID in
               CUDA_VISIBLE_DEVICES (fresh processes)
  torch        torch's version, NCCL's, default_stream().cuda_stream, the keys of memory_stats(),
               the parameters of _record_memory_history, the keys of a snapshot's segments,
               blocks and trace entries (with a private MemPool), and the snapshot itself
               (written to DIR as torch-<version>-snapshot.pickle)
  history      PyTorch's and sympool's _snapshot() and _dump_snapshot() of a 100k-entry history,
               and a 512-byte allocate+free pair from Python with history off, on without
               contexts and on with Python stacks (medians; the two libraries alternated)

Every part runs even if another failed; a failure is recorded as its error text, and the exit
status is 1 when any part failed (the GPU check's step then fails)."""

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
SNAP = sys.argv[sys.argv.index("--snap") + 1] if "--snap" in sys.argv else None
MiB = 1 << 20


def cudart():
    import glob
    for pat in ("/usr/local/cuda/lib64/libcudart.so*",):
        for p in sorted(glob.glob(pat)):
            try:
                return ctypes.CDLL(p)
            except OSError:
                pass
    try:
        import nvidia.cuda_runtime as m
        base = list(m.__path__)[0]
        for p in sorted(glob.glob(os.path.join(base, "lib", "libcudart.so*"))):
            return ctypes.CDLL(p)
    except Exception:
        pass
    return ctypes.CDLL("libcudart.so")


CHILD_CONTEXT = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[1]); import probe
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
def state():
    flags = ctypes.c_uint(); active = ctypes.c_int()
    rc = cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    return rc, active.value
rt = probe.cudart()
before = state()
status = ctypes.c_int(-1)
rc = rt.cudaStreamIsCapturing(ctypes.c_void_p(0), ctypes.byref(status))
after = state()
print(json.dumps({"primary_ctx_active_before": before[1], "cudaStreamIsCapturing_rc": rc,
                  "capture_status": status.value, "primary_ctx_active_after": after[1]}))
"""

CHILD_BUS = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[1]); import probe
rt = probe.cudart()
buf = ctypes.create_string_buffer(64)
n = ctypes.c_int(-1)
rc0 = rt.cudaGetDeviceCount(ctypes.byref(n))
rc = rt.cudaDeviceGetPCIBusId(buf, 64, 0)
print(json.dumps({"count_rc": rc0, "count": n.value, "rc": rc, "bus_id": buf.value.decode()}))
"""


def child(code, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code, HERE], capture_output=True, text=True,
                       env=e, timeout=60)
    if r.returncode != 0:
        return {"error": r.stderr[-800:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def part_context():
    return child(CHILD_CONTEXT)


def part_bus_id():
    out = {"index_0": child(CHILD_BUS, {"CUDA_VISIBLE_DEVICES": "0"})}
    r = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                       capture_output=True, text=True)
    uuid = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    out["uuid"] = uuid
    if uuid:
        out["by_uuid"] = child(CHILD_BUS, {"CUDA_VISIBLE_DEVICES": uuid})
    return out


class Prop(ctypes.Structure):
    # CUmemAllocationProp (cuda.h): type, requestedHandleTypes, location {type, id}, win32 handle
    # metadata pointer, allocFlags {compressionType, gpuDirectRDMACapable, usage, reserved[4]}
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


def part_reserve():
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev = ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    prop = Prop(type=1, requestedHandleTypes=0, loc_type=1, loc_id=0)
    gran = ctypes.c_size_t()
    rc = cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0)
    rec = ctypes.c_size_t()
    rc2 = cu.cuMemGetAllocationGranularity(ctypes.byref(rec), ctypes.byref(prop), 1)
    out = {"granularity_rc": rc, "granularity_min": gran.value, "recommended_rc": rc2,
           "granularity_recommended": rec.value, "reservations": []}
    cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                       ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
    cu.cuMemAddressFree.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
    held = []
    for size in (2 * MiB, 20 * MiB, 2 * MiB, 1 << 30, 6 * MiB, 1 << 34, 2 * MiB):
        ptr = ctypes.c_uint64()
        r = cu.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0)
        out["reservations"].append({"size": size, "rc": r, "base_mod_granularity":
                                    ptr.value % max(gran.value, 1), "base_mod_2MiB": ptr.value % (2 * MiB),
                                    "base_mod_1GiB": ptr.value % (1 << 30), "base_hex": hex(ptr.value)})
        if r == 0:
            held.append((ptr.value, size))
    for p, s in held:
        cu.cuMemAddressFree(p, s)
    return out


def part_torch():
    import torch
    out = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
           "gpu": torch.cuda.get_device_name(0),
           "default_stream_cuda_stream": torch.cuda.default_stream().cuda_stream,
           "current_stream_cuda_stream": torch.cuda.current_stream().cuda_stream}
    import inspect
    out["_record_memory_history_params"] = list(inspect.signature(
        torch.cuda.memory._record_memory_history).parameters)
    torch.cuda.memory._record_memory_history(max_entries=10000)
    a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        b = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        c = torch.empty(700, dtype=torch.uint8, device="cuda")
    del c
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        d = torch.empty(1000, dtype=torch.uint8, device="cuda")
    del d
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    out["memory_stats_keys"] = sorted(stats)
    snap = torch.cuda.memory._snapshot()
    out["snapshot_keys"] = sorted(snap)
    segs = snap.get("segments", [])
    out["segment_keys"] = sorted({k for sg in segs for k in sg})
    out["block_keys"] = sorted({k for sg in segs for b in sg.get("blocks", []) for k in b})
    traces = snap.get("device_traces", [[]])
    out["trace_entry_keys"] = sorted({k for tr in traces for e in tr for k in e})
    out["trace_entries"] = [{k: (v if k != "frames" else len(v)) for k, v in e.items()}
                            for tr in traces for e in tr][:12]
    out["segment_pool_ids"] = [list(sg.get("segment_pool_id", ())) for sg in segs]
    out["allocator_settings"] = snap.get("allocator_settings")
    if SNAP:
        import pickle
        path = os.path.join(SNAP, f"torch-{torch.__version__.split('+')[0]}-snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(snap, f)
        out["snapshot_written"] = path
    torch.cuda.memory._record_memory_history(enabled=None)
    del a, b
    return out


def timed(fn, reps=3):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def part_history():
    import torch
    import sympool
    sympool.init()
    out = {"sympool_backend": sympool.backend(), "entries": 100_000}
    torch.empty(1, device="cuda")

    def fill_torch():
        for _ in range(50_000):
            t = torch.empty(512, dtype=torch.uint8, device="cuda")
            del t

    def fill_sympool():
        for _ in range(50_000):
            sympool.free(sympool.malloc(512))

    for ctx in (None, "all"):
        key = "ctx_" + str(ctx)
        torch.cuda.memory._record_memory_history(context=ctx, stacks="python", max_entries=100_000)
        fill_torch()
        out[f"torch_{key}_snapshot_ms"] = 1e3 * timed(torch.cuda.memory._snapshot)
        out[f"torch_{key}_dump_ms"] = 1e3 * timed(
            lambda: torch.cuda.memory._dump_snapshot("/dev/shm/probe_torch.pickle"))
        out[f"torch_{key}_trace_len"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
        torch.cuda.memory._record_memory_history(enabled=None)
        sympool.record_memory_history(context=ctx, stacks="python", max_entries=100_000)
        fill_sympool()
        out[f"sympool_{key}_snapshot_ms"] = 1e3 * timed(lambda: sympool.memory._snapshot())
        out[f"sympool_{key}_dump_ms"] = 1e3 * timed(
            lambda: sympool.memory._dump_snapshot("/dev/shm/probe_sympool.pickle"))
        out[f"sympool_{key}_trace_len"] = len(sympool.memory._snapshot()["device_traces"][0])
        sympool.record_memory_history(enabled=None)

    # A Python-level pair: both libraries pay the interpreter; history's cost is the difference.
    n = 20_000

    def pair_torch():
        for _ in range(n):
            t = torch.empty(512, dtype=torch.uint8, device="cuda")
            del t

    def pair_sympool():
        for _ in range(n):
            sympool.free(sympool.malloc(512))

    modes = {"off": None, "on_no_context": dict(context=None, stacks="python", max_entries=100_000),
             "on_python_stacks": dict(context="all", stacks="python", max_entries=100_000)}
    res = {f"{lib}_{m}": [] for lib in ("torch", "sympool") for m in modes}
    for _ in range(5):
        for m, kw in modes.items():
            if kw:
                torch.cuda.memory._record_memory_history(**kw)
            res[f"torch_{m}"].append(timed(pair_torch, 1) / n * 1e9)
            torch.cuda.memory._record_memory_history(enabled=None)
            if kw:
                sympool.record_memory_history(**kw)
            res[f"sympool_{m}"].append(timed(pair_sympool, 1) / n * 1e9)
            sympool.record_memory_history(enabled=None)
    out["pair_ns_median_of_5"] = {k: statistics.median(v) for k, v in res.items()}
    return out


def main():
    result = {}
    for name, fn in (("context", part_context), ("bus_id", part_bus_id), ("reserve", part_reserve),
                     ("torch", part_torch), ("history", part_history)):
        t0 = time.time()
        try:
            result[name] = fn()
        except Exception:
            result[name] = {"error": traceback.format_exc()[-1500:]}
        result[name + "_seconds"] = round(time.time() - t0, 1)
        print(f"probe: {name} done in {result[name + '_seconds']} s", flush=True)
    text = json.dumps(result, indent=1, sort_keys=True, default=str)
    print(text)
    if OUT:
        with open(OUT, "w") as f:
            f.write(text + "\n")
    failed = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    if failed:
        print(f"probe: failed: {' '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
