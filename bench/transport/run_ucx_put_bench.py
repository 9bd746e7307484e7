#!/usr/bin/env python3
"""UCX put bandwidth of tessera's UcxEndpoint vs ucx_perftest (ucp_put_bw), same sizes, same run.
Usage: run_ucx_put_bench.py BENCH_BINARY [MAX_BYTES]   (needs tools/tessera-launch, ucx_perftest)
Prints one line per size with both bandwidths (MB/s, MB = 2^20 B) and the ratio, then the config."""
import os
import re
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
launch = os.path.join(here, "..", "..", "tools", "tessera-launch")
binary = sys.argv[1]
max_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 20


def perftest(size, iterations, port):
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "ucp_put_bw", "-s", str(size),
                              "-n", str(iterations), "-w", "3"], capture_output=True, text=True, timeout=300).stdout
    finally:
        server.wait(timeout=60) if server.poll() is None else None
    for line in out.splitlines():
        if line.startswith("Final:"):
            return float(line.split()[6])  # overall bandwidth, MB/s
    raise RuntimeError("ucx_perftest printed no Final line:\n" + out)


r = subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port", "29651", "--no-prefix", "--",
                    binary, str(max_bytes)], capture_output=True, text=True, timeout=900)
if r.returncode != 0:
    sys.exit("bench failed:\n" + r.stdout + r.stderr)
ours = {}
for line in r.stdout.splitlines():
    m = re.match(r"ucx_put size=(\d+) iterations=(\d+) mbps=([\d.]+)", line)
    if m:
        ours[int(m.group(1))] = (int(m.group(2)), float(m.group(3)))
print(f"{'size':>10} {'tessera MB/s':>13} {'perftest MB/s':>14} {'ratio':>6}")
port = 13400
for size, (iterations, mbps) in sorted(ours.items()):
    base = perftest(size, iterations, port)
    port += 1
    print(f"{size:>10} {mbps:>13.1f} {base:>14.1f} {mbps / base:>6.2f}")
commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"config: commit={commit} processes=2 UCX_TLS={os.environ.get('UCX_TLS', '(default)')} host={os.uname().nodename}")
