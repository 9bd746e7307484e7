#!/usr/bin/env python3
"""Runs a command; passes when it exits with --status within --max-seconds and its output contains
every --contains text. Usage: expect_exit.py --status N [--max-seconds S] [--contains TEXT]... -- CMD..."""
import argparse
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--status", type=int, required=True)
p.add_argument("--max-seconds", type=float, default=120)
p.add_argument("--contains", action="append", default=[])
p.add_argument("cmd", nargs=argparse.REMAINDER)
a = p.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
t0 = time.monotonic()
try:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.max_seconds + 30)
except subprocess.TimeoutExpired:
    print(f"FAIL: did not end within {a.max_seconds + 30} s")
    sys.exit(1)
elapsed = time.monotonic() - t0
out = r.stdout + r.stderr
print(out)
ok = True
if r.returncode != a.status:
    print(f"FAIL: exit status {r.returncode}, expected {a.status}")
    ok = False
if elapsed > a.max_seconds:
    print(f"FAIL: took {elapsed:.1f} s, more than {a.max_seconds}")
    ok = False
for text in a.contains:
    if text not in out:
        print(f"FAIL: output lacks '{text}'")
        ok = False
print(f"elapsed {elapsed:.1f} s")
sys.exit(0 if ok else 1)
