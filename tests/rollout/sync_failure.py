#!/usr/bin/env python3
"""Starts a training and a rollout tessera-launch job that share one store, for weight-sync tests
in which the training job is meant to fail (tests/transport/two_jobs.py expects both to pass).
Usage:
  sync_failure.py LAUNCH PORT [--store-host train|rollout] [--train-nproc N] [--rollout-nproc N]
                  [--expect-train-rc RC] [--deadline S] -- PROGRAM [ARGS...]
The job named by --store-host starts first and its rank 0 hosts the store. Every rank gets
TESSERA_UCX_ROLE, TESSERA_PEER_JOB, TESSERA_PEER_NPROC (the other job's size),
TESSERA_SYNC_STORE_HOST and TESSERA_SYNC_KILL_FILE (a scratch path, removed at the end).
Passes when the rollout job exits 0 and the training job exits with --expect-train-rc (default 0),
both within --deadline seconds; past it both jobs are ended (SIGTERM, then SIGKILL) and it fails."""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("launch")
ap.add_argument("port")
ap.add_argument("--store-host", choices=["train", "rollout"], default="train")
ap.add_argument("--train-nproc", type=int, default=2)
ap.add_argument("--rollout-nproc", type=int, default=2)
ap.add_argument("--expect-train-rc", type=int, default=0)
ap.add_argument("--deadline", type=float, default=90)
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
args = ap.parse_args(sys.argv[1:split])
program = sys.argv[split + 1:]
if not program:
    ap.error("no program after --")

SECRET = os.urandom(16).hex()  # jobs that must meet share the store secret
KILL_FILE = os.path.join(tempfile.gettempdir(), f"tessera_sync_kill_{args.port}")
TRAIN, ROLLOUT = f"syncfail_train_{args.port}", f"syncfail_rollout_{args.port}"
nproc = {"train": args.train_nproc, "rollout": args.rollout_nproc}
job = {"train": TRAIN, "rollout": ROLLOUT}
other = {"train": "rollout", "rollout": "train"}


def start(role):
    env = dict(os.environ, TESSERA_PEER_JOB=job[other[role]], TESSERA_UCX_ROLE=role, TESSERA_STORE_SECRET=SECRET,
               TESSERA_PEER_NPROC=str(nproc[other[role]]), TESSERA_SYNC_STORE_HOST=args.store_host,
               TESSERA_SYNC_KILL_FILE=KILL_FILE, TESSERA_STORE_SERVER="" if role == args.store_host else "0")
    # Its own process group, so that a hung job can be ended whole.
    return subprocess.Popen([sys.executable, args.launch, "--nproc-per-node", str(nproc[role]), "--master-port",
                             args.port, "--job", job[role], "--grace-period", "2", "--"] + program,
                            env=env, start_new_session=True)


if os.path.exists(KILL_FILE):
    os.remove(KILL_FILE)
t0 = time.monotonic()
procs = {args.store_host: start(args.store_host)}
time.sleep(0.3)
procs[other[args.store_host]] = start(other[args.store_host])
status = {}
deadline = t0 + args.deadline
while time.monotonic() < deadline and len(status) < 2:
    for role, proc in procs.items():
        if role not in status and proc.poll() is not None:
            status[role] = proc.returncode
            print(f"sync_failure: {role} job exited {proc.returncode} after {time.monotonic() - t0:.1f} s", flush=True)
    time.sleep(0.1)
hung = [role for role in procs if role not in status]
for role in hung:
    print(f"sync_failure: the {role} job is still running after {args.deadline:.0f} s: ending it", flush=True)
    procs[role].send_signal(signal.SIGTERM)  # the launcher forwards it to its ranks
for role in hung:
    try:
        procs[role].wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(procs[role].pid, signal.SIGKILL)
        procs[role].wait()
if os.path.exists(KILL_FILE):
    os.remove(KILL_FILE)
expected = {"train": args.expect_train_rc, "rollout": 0}
print(f"sync_failure: {status} (expected {expected}) in {time.monotonic() - t0:.1f} s")
sys.exit(0 if status == expected else 1)
