#!/usr/bin/env python3
"""replay --json keeps its strings whole: a trace path with a quote, a backslash and a tab comes
back exactly (the old escaper dropped control characters). argv: sympool, trace."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

cli, trace = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    odd = os.path.join(tmp, 'a"b\\c\td.json')
    shutil.copyfile(trace, odd)
    out = subprocess.run([cli, "replay", odd, "--json"], capture_output=True, text=True,
                         check=True).stdout
    rec = json.loads(out)
    if rec["trace"] != odd:
        sys.exit(f"trace came back as {rec['trace']!r}, not {odd!r}")
print("ok")
