#!/usr/bin/env python3
"""Runs sync_bench as two jobs sharing one store: TRAIN_RANKS training ranks -> ROLLOUT_RANKS rollout
ranks (default 2 -> 4), and forwards the JSON lines of both jobs (every process prints a "process"
line: bytes, puts, staging peak, peak RSS). Then, in the same run and after both jobs ended,
ucx_perftest (ucp_put_bw, a server and a client on loopback, the same UCX_TLS as the bench) at the
sync's average and largest put size of the sending training ranks, and one JSON line per size and
perftest memory with the sync's bandwidth (useful bytes / transfer time) over ucx_perftest's.
Perftest memory: "ucx_allocated" (perftest's own, from UCX's allocator: on one node a sysv/posix
segment the peer maps, so a put is one memcpy into it) and "heap" (UCX_ALLOC_PRIO=heap: ordinary
memory registered afterwards, as the sync's torch tensors are; UCX 1.13 then emulates the put over
shared-memory active messages, which the target must progress): the second is like for like. Usage:
  run_sync_bench.py [--build DIR] [--train-ranks N] [--rollout-ranks N] [--no-perftest]
                    [-- sync_bench args, e.g. --hidden 512 --layers 2 --vocab 8192 --replica-policy balanced]"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.path.join(root, "build"))
ap.add_argument("--train-ranks", type=int, default=2)
ap.add_argument("--rollout-ranks", type=int, default=4)
ap.add_argument("--port", type=int, default=29880)
ap.add_argument("--perftest-port", type=int, default=29897)
ap.add_argument("--perftest-bytes", type=float, default=2.5e8, help="bytes ucx_perftest moves per run (default 2.5e8)")
ap.add_argument("--perftest-runs", type=int, default=3, help="runs per size and memory; the median is compared (default 3)")
ap.add_argument("--no-perftest", action="store_true")
args, extra = ap.parse_known_args()
extra = [e for e in extra if e != "--"]
program = os.path.join(args.build, "bench", "sync", "sync_bench")
launch = os.path.join(root, "tools", "tessera-launch")
secret = os.urandom(16).hex()


def start(n, job, peer, role, server, out):
    env = dict(os.environ, TESSERA_STORE_SECRET=secret)
    if not server:
        env["TESSERA_STORE_SERVER"] = "0"
    return subprocess.Popen([sys.executable, launch, "--nproc-per-node", str(n), "--master-port", str(args.port),
                             "--job", job, "--no-prefix", "--", program, "--role", role, "--peer-job", peer] + extra,
                            env=env, stdout=out, text=True)


# Both jobs write to files (a pipe nobody reads could fill and stall a job).
with tempfile.TemporaryFile("w+") as train_out, tempfile.TemporaryFile("w+") as rollout_out:
    train = start(args.train_ranks, "bench_train", "bench_rollout", "train", True, train_out)
    time.sleep(0.5)
    rollout = start(args.rollout_ranks, "bench_rollout", "bench_train", "rollout", False, rollout_out)
    rollout.wait(timeout=1200)
    train.wait(timeout=120)
    lines = []
    for f in (rollout_out, train_out):
        f.seek(0)
        lines += [line.strip() for line in f if line.startswith("{")]
for line in lines:
    print(line)
if rollout.returncode != 0 or train.returncode != 0:
    sys.exit(1)

records = [json.loads(line) for line in lines]
sync = next(r for r in records if r.get("mode") == "sync")
processes = [r for r in records if r.get("mode") == "process"]
senders = [r for r in processes if r["role"] == "train" and r["puts"] > 0]
# Staging is used where a segment is packed before its put: on the sending training ranks.
print(json.dumps({"bench": "weight_sync", "check": "staging_peak_bytes",
                  "senders_with_staging": sum(1 for r in senders if r["staging_peak_bytes"] > 0),
                  "senders": len(senders),
                  "rollout_staging_peak_bytes": max(r["staging_peak_bytes"] for r in processes if r["role"] == "rollout"),
                  "max_rss_mib": {f'{r["role"]}{r["rank"]}': round(r["max_rss_kib"] / 1024) for r in processes}}))
if args.no_perftest or not senders:
    sys.exit(0)

perftest = shutil.which("ucx_perftest")
if not perftest:
    print(json.dumps({"bench": "weight_sync", "mode": "vs_ucx_perftest", "error": "ucx_perftest not found"}))
    sys.exit(0)
sent = sum(r["bytes_sent"] for r in senders)
sizes = {"average_put": int(round(sent / sum(r["puts"] for r in senders))),
         "largest_put": max(r["largest_put_bytes"] for r in senders)}
# The sync's bandwidth: the whole model's useful bytes over the transfer batch (the slowest rank's
# view: the rollout rank 0's median), and with the verification included.
sync_mib_s = sync["bytes"] / (sync["transfer_ms"] / 1e3) / 2**20
sync_verified_mib_s = sync["bytes"] / (sync["ms"] / 1e3) / 2**20


def put_bandwidth(size, memory):
    """ucx_perftest ucp_put_bw between two processes on loopback: MiB/s (UCX's MB is 2^20)."""
    env = dict(os.environ)
    if memory == "heap":
        env["UCX_ALLOC_PRIO"] = "heap"
    iters = int(max(20, min(200000, args.perftest_bytes / size)))
    common = ["-t", "ucp_put_bw", "-s", str(size), "-n", str(iters), "-w", str(max(2, iters // 10)),
              "-p", str(args.perftest_port), "-f"]
    server = subprocess.Popen([perftest] + common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    time.sleep(0.5)
    try:
        client = subprocess.run([perftest, "127.0.0.1"] + common, capture_output=True, text=True, timeout=300, env=env)
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    rows = [l.split() for l in client.stdout.splitlines() if l.split() and l.split()[0].isdigit()]
    if client.returncode != 0 or not rows:
        raise RuntimeError(f"ucx_perftest failed ({client.returncode}): {client.stdout[-500:]} {client.stderr[-500:]}")
    # iterations, overhead 50%ile/average/overall (us), bandwidth average/overall (MB/s), rates
    return float(rows[-1][5]), iters  # overall: every iteration's bytes over the whole time


tls = os.environ.get("UCX_TLS", "(default)")
for memory in ("ucx_allocated", "heap"):
    for which, size in sizes.items():
        runs = [put_bandwidth(size, memory) for _ in range(args.perftest_runs)]
        bandwidth, iters = sorted(runs)[len(runs) // 2]
        print(json.dumps({"bench": "weight_sync", "mode": "vs_ucx_perftest", "put_size": which, "message_bytes": size,
                          "perftest_memory": memory, "ucx_tls": tls, "perftest_iterations": iters,
                          "perftest_runs_MiB_s": [round(b, 1) for b, _ in runs],
                          "perftest_MiB_s": round(bandwidth, 1), "sync_MiB_s": round(sync_mib_s, 1),
                          "sync_verified_MiB_s": round(sync_verified_mib_s, 1),
                          "ratio_sync_to_perftest": round(sync_mib_s / bandwidth, 3),
                          "ratio_verified_sync_to_perftest": round(sync_verified_mib_s / bandwidth, 3)}))
