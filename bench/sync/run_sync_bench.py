#!/usr/bin/env python3
"""Runs sync_bench as two jobs sharing one store: TRAIN_RANKS training ranks -> ROLLOUT_RANKS rollout
ranks (default 2 -> 4), and forwards the JSON lines of both jobs (every process prints a "process"
line: bytes, puts and their sizes, staging peak, peak RSS; a sending training rank also the memcpy
of its share, below). Then, in the same run and after both jobs ended, the baselines the sync is
compared with, one JSON line each, and a "vs_baselines" line with every ratio:
  sync          wire bytes (what the senders put) / the transfer time of rollout rank 0 (median of
                the repeats; min and max given): the bandwidth a user sees, agreement included.
  perftest      ucx_perftest ucp_put_bw (a server and a client on loopback, the same UCX_TLS) with
                its own UCX-allocated buffers at both ends, as the sink's targets are (shared memory
                on one node: a put is one memcpy into it), at every put size the sync sends (a
                row-parallel shard, copied row by row into the mapped target, at its whole size):
                "at_sync_sizes" is what perftest would take for the sync's puts (their bytes at each
                size over perftest's bandwidth there, summed); "largest_put" is perftest at the
                largest; "streaming" is perftest putting one sender's whole share at once (at least
                twice the last-level cache), so that its bytes come from memory as the sync's do. Perftest re-puts one buffer, so below the caches' size (L2 2 MiB, L3 32 MiB
                here) it moves cache-resident bytes; the sync's 327 MB never are: this baseline
                flatters perftest, not the sync.
  memcpy        the like-for-like one: each sender copies its same segments (core/affine's local
                executor, no staging) from the same engine buffers into UCX-allocated memory laid
                out as the rollout ranks', already touched: a put that is nothing but its copy,
                with neither end cache-resident (sync_bench's "memcpy_ms"), right after each sync,
                so "ratio_sync_to_memcpy_per_sync" pairs runs under the same load.
(ucx_perftest with heap buffers, UCX_ALLOC_PRIO=heap, is no longer compared: the sink's targets are
UCX-allocated, and a heap target makes UCX emulate the put over active messages, 0.1 GiB/s, a
baseline that would flatter the sync 40-50x.) Usage:
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
senders = [r for r in processes if r["role"] == "train" and r["bytes_sent"] > 0]
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
put_sizes = {}  # bytes -> puts of that size, over every sender
for r in senders:
    for size, count in r["put_sizes"]:
        put_sizes[size] = put_sizes.get(size, 0) + count
# The sync: the senders' wire bytes over rollout rank 0's transfer time (median, best, worst).
sync_MiB_s = {k: sent / (sync[f"transfer_ms{k}"] / 1e3) / 2**20 for k in ("", "_min", "_max")}
# The memcpy of the same segments: the senders copy at the same time, so the slowest one's time.
memcpy_ms = {k: max(r[f"memcpy_ms{k}"] for r in senders) for k in ("", "_min", "_max")}
memcpy_MiB_s = sum(r["memcpy_bytes"] for r in senders) / (memcpy_ms[""] / 1e3) / 2**20
# Each sync is followed by the memcpy (same load on the shared cores): the ratio per sync.
copied = sum(r["memcpy_bytes"] for r in senders)
per_sync = sorted((sent / t) / (copied / max(m)) for t, *m in
                  zip(sync["transfer_ms_each"], *[r["memcpy_ms_each"] for r in senders]))


def put_bandwidth(size):
    """ucx_perftest ucp_put_bw between two processes on loopback: MiB/s (UCX's MB is 2^20)."""
    iters = int(max(20, min(200000, args.perftest_bytes / size)))
    common = ["-t", "ucp_put_bw", "-s", str(size), "-n", str(iters), "-w", str(max(2, iters // 10)),
              "-p", str(args.perftest_port), "-f"]
    server = subprocess.Popen([perftest] + common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        client = subprocess.run([perftest, "127.0.0.1"] + common, capture_output=True, text=True, timeout=300)
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
perftest_MiB_s = {}
for size in sorted(put_sizes):
    runs = [put_bandwidth(size) for _ in range(args.perftest_runs)]
    perftest_MiB_s[size] = sorted(b for b, _ in runs)[len(runs) // 2]
    print(json.dumps({"bench": "weight_sync", "mode": "ucx_perftest", "message_bytes": size, "sync_puts": put_sizes[size],
                      "sync_bytes": size * put_sizes[size], "perftest_memory": "ucx_allocated", "ucx_tls": tls,
                      "perftest_iterations": runs[0][1], "perftest_runs_MiB_s": [round(b, 1) for b, _ in runs],
                      "perftest_MiB_s": round(perftest_MiB_s[size], 1)}))
# Streaming perftest: one put of a sender's whole share (at least twice the last-level cache, so that
# neither buffer stays cache-resident between iterations, as the sync's bytes never are): what UCX
# moves per second when the bytes come from and go to memory, the like-for-like form of perftest.
def last_level_cache_bytes():
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    for index in (os.listdir(base) if os.path.isdir(base) else []):
        try:
            text = open(os.path.join(base, index, "size")).read().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 * 2**20)


llc = last_level_cache_bytes()
streaming_size = max(2 * llc, sent // len(senders)) // 4096 * 4096
streaming_runs = [put_bandwidth(streaming_size) for _ in range(args.perftest_runs)]
perftest_streaming = sorted(b for b, _ in streaming_runs)[len(streaming_runs) // 2]
print(json.dumps({"bench": "weight_sync", "mode": "ucx_perftest_streaming", "message_bytes": streaming_size,
                  "last_level_cache_bytes": llc, "perftest_memory": "ucx_allocated", "ucx_tls": tls,
                  "perftest_iterations": streaming_runs[0][1],
                  "perftest_runs_MiB_s": [round(b, 1) for b, _ in streaming_runs],
                  "perftest_MiB_s": round(perftest_streaming, 1)}))
at_sizes_s = sum(size * n / 2**20 / perftest_MiB_s[size] for size, n in put_sizes.items())
perftest_at_sizes = sum(size * n for size, n in put_sizes.items()) / 2**20 / at_sizes_s
largest = max(put_sizes)
r = lambda x: round(x, 3)
print(json.dumps({"bench": "weight_sync", "mode": "vs_baselines", "ucx_tls": tls, "wire_bytes": sent,
                  "useful_bytes": sync["bytes"], "transfer_ms": sync["transfer_ms"],
                  "transfer_ms_range": [sync["transfer_ms_min"], sync["transfer_ms_max"]],
                  "sync_MiB_s": round(sync_MiB_s[""], 1),
                  "sync_MiB_s_range": [round(sync_MiB_s["_max"], 1), round(sync_MiB_s["_min"], 1)],
                  "sync_verified_MiB_s": round(sent / (sync["ms"] / 1e3) / 2**20, 1),
                  "perftest_at_sync_sizes_MiB_s": round(perftest_at_sizes, 1),
                  "perftest_largest_put_bytes": largest, "perftest_largest_put_MiB_s": round(perftest_MiB_s[largest], 1),
                  "memcpy_same_segments_ms": memcpy_ms[""], "memcpy_same_segments_MiB_s": round(memcpy_MiB_s, 1),
                  "ratio_sync_to_perftest_at_sync_sizes": r(sync_MiB_s[""] / perftest_at_sizes),
                  "ratio_sync_to_perftest_largest_put": r(sync_MiB_s[""] / perftest_MiB_s[largest]),
                  "perftest_streaming_bytes": streaming_size, "perftest_streaming_MiB_s": round(perftest_streaming, 1),
                  "ratio_sync_to_perftest_streaming": r(sync_MiB_s[""] / perftest_streaming),
                  "ratio_sync_to_memcpy": r(sync_MiB_s[""] / memcpy_MiB_s),
                  "ratio_sync_to_memcpy_per_sync": {"median": r(per_sync[len(per_sync) // 2]), "min": r(per_sync[0]),
                                                    "max": r(per_sync[-1])},
                  "ratio_verified_sync_to_memcpy": r(sent / (sync["ms"] / 1e3) / 2**20 / memcpy_MiB_s)}))
