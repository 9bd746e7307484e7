#!/usr/bin/env python3
"""Generation throughput of RolloutEngine at TP 1 and TP 2, measured in one run, as JSON lines.

  python3 bench/generate/run_generate_bench.py                      # build dir: <repo>/build
  python3 bench/generate/run_generate_bench.py --build build --new-tokens 16 --repeats 1

Runs build/bench/generate/gen_bench through tools/tessera-launch with 1 and then 2 ranks (master
ports 29841 and 29842), forwards its JSON lines (per mode: tokens/s with the KV cache and with full
recompute; per TP size: the cache's speed-up), and ends with
  {"bench":"generate","ratio_tp2_to_tp1_kv_cache":X,"ratio_tp2_to_tp1_recompute":Y}
(tokens/s at TP 2 over tokens/s at TP 1, per mode). Arguments this script does not know are passed
to gen_bench (--hidden, --layers, --batch, --prompt-len, --new-tokens, --repeats, ...).

gen_bench gives each rank hardware_concurrency / ranks-on-this-node threads, so on one machine TP 2
splits the same cores between two processes: on a 2-core machine the TP ratio measures the
overhead of tensor parallelism (communication, synchronisation, smaller matrices), not a speed-up.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "tools", "tessera-launch")


def run_ranks(program, nproc, port, extra):
    """Runs gen_bench on nproc ranks, returns the JSON lines it printed (launcher prefix removed)."""
    cmd = [sys.executable, LAUNCH, "--nproc-per-node", str(nproc), "--master-port", str(port), "--", program] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"gen_bench at TP {nproc} failed with status {proc.returncode}")
    lines = []
    for line in proc.stdout.splitlines():
        text = line.split(": ", 1)[1] if line.startswith("[rank") else line
        if text.startswith("{"):
            lines.append(json.loads(text))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (default: %(default)s)")
    a, extra = parser.parse_known_args()
    program = os.path.join(a.build, "bench", "generate", "gen_bench")
    if not os.path.exists(program):
        raise SystemExit(f"{program} not found: cmake --build {a.build} --target gen_bench")
    tokens_per_s = {}
    for tp, port in ((1, 29841), (2, 29842)):
        for line in run_ranks(program, tp, port, extra):
            print(json.dumps(line, separators=(",", ":")), flush=True)
            if "kv_cache" in line:
                tokens_per_s[(tp, line["kv_cache"])] = line["tokens_per_s"]
    print(json.dumps({"bench": "generate",
                      "ratio_tp2_to_tp1_kv_cache": round(tokens_per_s[(2, True)] / tokens_per_s[(1, True)], 4),
                      "ratio_tp2_to_tp1_recompute": round(tokens_per_s[(2, False)] / tokens_per_s[(1, False)], 4)},
                     separators=(",", ":")),
          flush=True)


if __name__ == "__main__":
    main()
