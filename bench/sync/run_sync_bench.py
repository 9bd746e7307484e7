#!/usr/bin/env python3
"""Runs sync_bench as two jobs sharing one store: TRAIN_RANKS training ranks -> ROLLOUT_RANKS rollout
ranks (default 2 -> 4), and forwards its JSON lines. Usage:
  run_sync_bench.py [--build DIR] [--train-ranks N] [--rollout-ranks N] [-- sync_bench args, e.g. --hidden 2048]"""
import argparse
import os
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(root, "build"))
ap.add_argument("--train-ranks", type=int, default=2)
ap.add_argument("--rollout-ranks", type=int, default=4)
ap.add_argument("--port", type=int, default=29880)
args, extra = ap.parse_known_args()
extra = [e for e in extra if e != "--"]
program = os.path.join(args.build, "bench", "sync", "sync_bench")
launch = os.path.join(root, "tools", "tessera-launch")
secret = os.urandom(16).hex()


def start(n, job, peer, role, server):
    env = dict(os.environ, TESSERA_STORE_SECRET=secret)
    if not server:
        env["TESSERA_STORE_SERVER"] = "0"
    return subprocess.Popen([sys.executable, launch, "--nproc-per-node", str(n), "--master-port", str(args.port),
                             "--job", job, "--no-prefix", "--", program, "--role", role, "--peer-job", peer] + extra,
                            env=env, stdout=subprocess.PIPE, text=True)


train = start(args.train_ranks, "bench_train", "bench_rollout", "train", True)
time.sleep(0.5)
rollout = start(args.rollout_ranks, "bench_rollout", "bench_train", "rollout", False)
out, _ = rollout.communicate(timeout=1200)
train.communicate(timeout=120)
for line in out.splitlines():
    if line.startswith("{"):
        print(line)
sys.exit(0 if rollout.returncode == 0 and train.returncode == 0 else 1)
