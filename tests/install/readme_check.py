#!/usr/bin/env python3
"""Every example README's shown commands and outputs, against the built programs.

In examples/NN_name/README.md:
  - an output block is the ``` block after a line "Output of `COMMAND` (...):"; COMMAND is run
    and every line shown (except "..." lines, which stand for what was trimmed) must appear in
    its output in the same order, with numbers free to differ (timings, addresses);
  - every command in a ```sh block that runs build/examples/NN_name must name a program that was
    built; those of 02 and 03 (seconds each) are run too, pipes included, and must succeed. A
    pipe into a tool this machine lacks (promtool) is skipped with a note.

usage: readme_check.py SOURCE_DIR BUILD_DIR WORK_DIR MPIEXEC
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

src, build, work, mpiexec = sys.argv[1:5]
failures = []
RUN_ALL = ("02_symmetric_basics", "03_stats_report")


def fail(what):
    failures.append(what)
    print("FAIL:", what)


def shell_line(cmd):
    """cmd with build/ pointing at this build and mpirun at MPIEXEC (oversubscribed)."""
    cmd = re.sub(r"(?<![\w/.])build/", build.rstrip("/") + "/", cmd)
    return re.sub(r"(?<![\w/])mpirun\b", shlex.quote(mpiexec) + " --oversubscribe", cmd)


_ran = {}


def run(cmd):
    """(exit status, stdout, stderr) of cmd, run once however often the READMEs show it."""
    if cmd not in _ran:
        os.makedirs(work, exist_ok=True)
        p = subprocess.run(["bash", "-o", "pipefail", "-c", shell_line(cmd)], cwd=work,
                           capture_output=True, text=True, timeout=240)
        _ran[cmd] = (p.returncode, p.stdout, p.stderr)
    return _ran[cmd]


def skeleton(line):
    line = re.sub(r"[-+]?\d+(\.\d+)?", "#", line)
    return " ".join(line.split())


def check_output(readme, command, shown):
    rc, out, err = run(command)
    if rc != 0:
        fail(f"{readme}: `{command}` exited {rc}: {err[-2000:]}")
        return
    actual = [skeleton(x) for x in (out + err).splitlines()]
    at = 0
    for want in shown:
        if want.strip() in ("", "...") or want.strip().startswith("..."):
            continue
        w = skeleton(want)
        while at < len(actual) and actual[at] != w:
            at += 1
        if at == len(actual):
            fail(f"{readme}: `{command}` does not print (in this order) the line\n    {want}\n"
                 f"  its output:\n" + "\n".join("    " + x for x in (out + err).splitlines()[:80]))
            return
        at += 1
    print(f"ok: {readme}: output of `{command}`")


def blocks(text):
    """(info line before the block, language, lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        yield before, m.group(1), lines[i + 1:j]
        i = j + 1


for readme in sorted(glob.glob(os.path.join(src, "examples", "[0-9][0-9]_*", "README.md"))):
    name = os.path.basename(os.path.dirname(readme))
    rel = os.path.relpath(readme, src)
    outputs = 0
    for before, lang, body in blocks(open(readme).read()):
        m = re.match(r"^Output of `([^`]+)`", before)
        if m and lang == "":
            outputs += 1
            check_output(rel, m.group(1), body)
        if lang != "sh":
            continue
        for line in body:
            cmd = line.split(" #")[0].strip()
            prog = re.search(r"build/examples/(\w+)", cmd)
            if not prog:
                continue
            if not os.access(os.path.join(build, "examples", prog.group(1)), os.X_OK):
                fail(f"{rel}: `{cmd}` runs {prog.group(1)}, which was not built")
                continue
            if prog.group(1) not in RUN_ALL or name not in RUN_ALL:
                continue
            missing = [t for t in re.findall(r"\|\s*(\w+)", cmd) if shutil.which(t) is None]
            if missing:
                print(f"skipped: {rel}: `{cmd}` ({', '.join(missing)} not installed)")
                continue
            rc, out, err = run(cmd)
            if rc != 0:
                fail(f"{rel}: `{cmd}` exited {rc}:\n{out[-1500:]}{err[-1500:]}")
            else:
                print(f"ok: {rel}: `{cmd}`")
    if outputs == 0:
        fail(f"{rel}: no 'Output of `command`' block")

if failures:
    print(f"readme check: {len(failures)} failure(s)")
    sys.exit(1)
print("readmes ok")
