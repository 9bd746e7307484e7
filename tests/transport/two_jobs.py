#!/usr/bin/env python3
"""Starts two tessera-launch jobs at once that share one store (the first job's rank 0 hosts it).
Usage: two_jobs.py LAUNCH PORT NAME_A NPROC_A ROLE_A NAME_B NPROC_B ROLE_B -- PROGRAM [ARGS...]
Passes when both launchers exit 0 within 120 s."""
import os
import subprocess
import sys
import time

launch, port, name_a, n_a, role_a, name_b, n_b, role_b = sys.argv[1:9]
program = sys.argv[10:] if sys.argv[9] == "--" else sys.argv[9:]


# Jobs that must meet are given the same store secret by whoever starts them.
SECRET = os.urandom(16).hex()


def start(name, n, role, peer, server):
    env = dict(os.environ, TESSERA_PEER_JOB=peer, TESSERA_UCX_ROLE=role, TESSERA_STORE_SERVER=server,
               TESSERA_STORE_SECRET=SECRET)
    # The second job's rank 0 must not start a server of its own.
    return subprocess.Popen([sys.executable, launch, "--nproc-per-node", n, "--master-port", port, "--job", name,
                             "--grace-period", "2", "--"] + program, env=env)


t0 = time.monotonic()
a = start(name_a, n_a, role_a, name_b, "")
time.sleep(0.3)
b = start(name_b, n_b, role_b, name_a, "0")
status = {}
deadline = time.monotonic() + 120
while time.monotonic() < deadline and len(status) < 2:
    for name, proc in ((name_a, a), (name_b, b)):
        if name not in status and proc.poll() is not None:
            status[name] = proc.returncode
    time.sleep(0.1)
for proc in (a, b):
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)
print(f"two_jobs: {status} in {time.monotonic() - t0:.1f} s")
sys.exit(0 if status == {name_a: 0, name_b: 0} else 1)
