#!/usr/bin/env python3
"""--json outputs keep their strings whole: a trace path with a quote, a backslash and a tab comes
back exactly (the old escaper dropped control characters), and so does a path whose bytes are not
UTF-8: as the str Python holds for it (sys.argv, os.fsdecode: 'surrogateescape'), which
os.fsencode turns back into the path (such bytes were '?'). argv: sympool, trace."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

cli, trace = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    names = ['a"b\\c\td.json', os.fsdecode(b"e\xfff\xed\xa0\x80g\xc3.json")]
    for name in names:
        odd = os.path.join(tmp, name)
        shutil.copyfile(trace, odd)
        for args in (["replay", odd, "--json"], ["info", "--json", odd]):
            out = subprocess.run([cli] + args, capture_output=True, check=True).stdout
            rec = json.loads(out)
            if rec["trace"] != odd:
                sys.exit(f"{args[0]}: trace came back as {rec['trace']!r}, not {odd!r}")
print("ok")
