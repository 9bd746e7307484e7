#!/usr/bin/env python3
"""Memory results of the engine, measured in one run, as JSON lines.

  python3 bench/memory/run_memory_bench.py build            # both parts (about 10 minutes on 2 cores)
  python3 bench/memory/run_memory_bench.py build --only saving
  python3 bench/memory/run_memory_bench.py build --only flat --steps 1000

saving: peak RSS per rank (VmHWM) of mlp_memory on the 51 M-parameter MLP (256-4096x4-16, fp32,
  2 ranks, 4 steps) at stage 1 (the baseline) and stage 2; the saving as a ratio to half the
  gradient bytes (what ZeRO-2 exists to save at 2 ranks); at DeepSpeed's default
  reduce_bucket_size (5e8) and at 2e6.
flat: RSS every 50 steps over --steps steps of the 3.4 M-parameter MLP (256-1024x4-16) at stages
  0, 1, 2 and 3, and of examples/train_lm (sampled from outside every second); growth = the largest
  RSS after warm-up (the first 10% of the run) over the RSS at the end of warm-up, minus 1.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "tools", "tessera-launch")


def run_ranks(build, args, port):
    """Runs a program on 2 ranks, returns the JSON lines it printed (launcher prefix removed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, LAUNCH, "--nproc-per-node", "2", "--master-port", str(port), "--"] + args
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        text = line.split(": ", 1)[1] if line.startswith("[rank") else line
        if text.startswith("{"):
            lines.append(json.loads(text))
    return lines


def saving(build):
    for bucket in (500_000_000, 2_000_000):
        saving_at(build, bucket)


def saving_at(build, bucket):
    program = os.path.join(build, "bench", "memory", "mlp_memory")
    peaks = {}
    for stage in (1, 2):
        lines = run_ranks(build, [program, "--width", "4096", "--stage", str(stage), "--steps", "4",
                                  "--bucket", str(bucket)], 29810 + stage)
        last = [l for l in lines if l["kind"] == "peak"]
        peaks[stage] = max(l["peak_mb"] for l in last)
        parameters, bucket = last[0]["parameters"], last[0]["bucket_elements"]
    half_gradient_mb = parameters * 4 / 2 / 2**20
    saved = peaks[1] - peaks[2]
    print(json.dumps({"bench": "stage2_memory", "parameters": parameters, "world": 2, "dtype": "fp32",
                      "bucket_elements": bucket, "stage1_peak_mb": peaks[1], "stage2_peak_mb": peaks[2],
                      "saved_mb": round(saved, 1), "half_gradient_mb": round(half_gradient_mb, 1),
                      "saved_over_half_gradient": round(saved / half_gradient_mb, 3)}), flush=True)


def growth(curve):
    warm = max(1, len(curve) // 10)
    base = curve[warm - 1]
    return max(curve[warm:] or [base]) / base - 1, base


def flat_mlp(build, steps):
    program = os.path.join(build, "bench", "memory", "mlp_memory")
    for stage in (0, 1, 2, 3):
        lines = run_ranks(build, [program, "--width", "1024", "--stage", str(stage), "--steps", str(steps),
                                  "--sample-every", "50"], 29820 + stage)
        for rank in (0, 1):
            curve = [l["rss_mb"] for l in lines if l["kind"] == "sample" and l["rank"] == rank]
            g, base = growth(curve)
            print(json.dumps({"bench": "rss_curve", "model": "mlp 256-1024x4-16", "parameters": lines[0]["parameters"],
                              "stage": stage, "rank": rank, "steps": steps, "rss_mb_every_50_steps": curve,
                              "rss_after_warmup_mb": base, "growth": round(g, 4)}), flush=True)


def children_rss_mb(pid):
    """VmRSS of every descendant of pid, by pid."""
    out = {}
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    except OSError:
        return out
    for kid in kids:
        try:
            with open(f"/proc/{kid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out[int(kid)] = int(line.split()[1]) / 1024
        except OSError:
            pass
        out.update(children_rss_mb(int(kid)))
    return out


def flat_train_lm(build, steps):
    """train_lm at stages 0, 1, 2 (its own config, whose stage is "auto": --zero-stage picks it), 4 sequences
    of 64 tokens per micro-step to keep 1,000 steps short; RSS of each rank sampled from outside every second."""
    program = os.path.join(build, "examples", "train_lm", "train_lm")
    config = os.path.join(ROOT, "examples", "train_lm", "train_lm.toml")
    for stage in (0, 1, 2):
        cmd = [sys.executable, LAUNCH, "--nproc-per-node", "2", "--master-port", str(29830 + stage), "--", program,
               "--config", config, "--zero-stage", str(stage), "--steps", str(steps), "--csv", "", "--micro-batch", "4",
               "--context", "64"]
        proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        samples = {}
        while proc.poll() is None:
            for pid, rss in children_rss_mb(proc.pid).items():
                samples.setdefault(pid, []).append(rss)
            time.sleep(1.0)
        if proc.returncode != 0:
            raise SystemExit(f"train_lm at stage {stage} failed with status {proc.returncode}")
        for pid, curve in samples.items():
            if len(curve) < 10:
                continue
            g, base = growth(curve)
            print(json.dumps({"bench": "rss_curve", "model": "train_lm", "stage": stage, "steps": steps, "pid": pid,
                              "rss_mb_sampled": [round(x, 1) for x in curve[:: max(1, len(curve) // 40)]],
                              "seconds": len(curve), "rss_after_warmup_mb": round(base, 1),
                              "growth": round(g, 4)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", help="the build directory")
    parser.add_argument("--only", choices=["saving", "flat"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--skip-train-lm", action="store_true")
    a = parser.parse_args()
    if a.only in (None, "saving"):
        saving(a.build)
    if a.only in (None, "flat"):
        flat_mlp(a.build, a.steps)
        if not a.skip_train_lm:
            flat_train_lm(a.build, a.steps)


if __name__ == "__main__":
    main()
