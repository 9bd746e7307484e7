#!/usr/bin/env python3
"""The GRPO example, short and seeded: both jobs start, run, end cleanly, and the mean reward of
the last steps is clearly above that of the first (the loop learns). Nothing about speed.
Usage: grpo_reward_rises.py BUILD_DIR PORT"""
import os
import subprocess
import sys
import tempfile

build, port = sys.argv[1], sys.argv[2]
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with tempfile.TemporaryDirectory() as out:
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "grpo", "run_grpo.py"), "--build", build,
                        "--port", port, "--out", out, "--", "--steps", "40", "--seed", "3"],
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"grpo_reward_rises: run_grpo.py exited {r.returncode}")
    rows = [l.strip().split(",") for l in open(os.path.join(out, "grpo.csv"))][1:]
    rewards = [float(x[1]) for x in rows]
    mismatch = max(float(x[4]) for x in rows)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    print(f"grpo_reward_rises: {len(rows)} steps, mean reward of the first 5 {first:.3f}, of the last 10 {last:.3f}, "
          f"largest log-prob mismatch {mismatch:.2e}; plot written: {os.path.exists(os.path.join(out, 'grpo.png'))}")
    if len(rows) != 40 or not os.path.exists(os.path.join(out, "grpo.png")):
        sys.exit("grpo_reward_rises: missing steps or plot")
    if last < first + 0.1:
        sys.exit("grpo_reward_rises: the reward did not rise")
    if mismatch > 1e-4:  # the same fp32 weights on both sides: float noise only
        sys.exit("grpo_reward_rises: the rollout's log-probs differ from the policy's")
