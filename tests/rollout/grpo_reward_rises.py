#!/usr/bin/env python3
"""The GRPO example, short and seeded: both jobs start, run, end cleanly, and the mean reward of
the last steps is clearly above that of the first (the loop learns). Nothing about speed.
With a ZeRO stage after the port, the training job runs at that stage and a second run at stage 2
(port + 1) is the oracle: training is exact at every stage and sampling is seeded, so every step's
reward, KL, loss and sequence log-probability must equal stage 2's as printed. Both runs then
have a KL term (--kl-beta 0.05): at stage 3 its reference is a ZeRO inference engine, at stage 2
a plain module.
Usage: grpo_reward_rises.py BUILD_DIR PORT [STAGE]"""
import os
import subprocess
import sys
import tempfile

build, port = sys.argv[1], int(sys.argv[2])
stage = int(sys.argv[3]) if len(sys.argv) > 3 else None
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "examples", "grpo"))
import plot_grpo  # noqa: E402


def run(out, port, stage, kl=False):
    extra = ["--steps", "40", "--seed", "3"] + (["--zero-stage", str(stage)] if stage is not None else [])
    extra += ["--kl-beta", "0.05"] if kl else []
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "grpo", "run_grpo.py"), "--build", build,
                        "--port", str(port), "--out", out, "--"] + extra, timeout=600)
    if r.returncode != 0:
        sys.exit(f"grpo_reward_rises: run_grpo.py (stage {stage}) exited {r.returncode}")
    lines = [l.strip().split(",") for l in open(os.path.join(out, "grpo.csv"))]
    header, rows = lines[0], lines[1:]
    if len(rows) != 40:
        sys.exit("grpo_reward_rises: missing steps")
    # The plot needs matplotlib (Debian's python3-matplotlib); without it run_grpo.py says so and skips it.
    if plot_grpo.plotting_python() is not None and not os.path.exists(os.path.join(out, "grpo.png")):
        sys.exit("grpo_reward_rises: matplotlib is there but no plot was drawn")
    return {name: [r[i] for r in rows] for i, name in enumerate(header)}


with tempfile.TemporaryDirectory() as out:
    curve = run(out, port, stage, kl=stage is not None)
    rewards = [float(x) for x in curve["reward"]]
    mismatch = max(float(x) for x in curve["logprob_mismatch"])
    first, last = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    print(f"grpo_reward_rises: stage {stage or 2}, {len(rewards)} steps, mean reward of the first 5 {first:.3f}, of the "
          f"last 10 {last:.3f}, largest log-prob mismatch {mismatch:.2e}")
    if last < first + 0.1:
        sys.exit("grpo_reward_rises: the reward did not rise")
    if mismatch > 1e-4:  # the same fp32 weights on both sides: float noise only
        sys.exit("grpo_reward_rises: the rollout's log-probs differ from the policy's")
    if stage is not None:
        with tempfile.TemporaryDirectory() as out2:
            oracle = run(out2, port + 1, None, kl=True)
        for column in ("reward", "kl", "loss", "neg_logprob"):
            for step, (a, b) in enumerate(zip(curve[column], oracle[column])):
                if a != b:
                    sys.exit(f"grpo_reward_rises: step {step + 1} {column} {a} at stage {stage}, {b} at stage 2")
        print(f"grpo_reward_rises: every step's reward, KL, loss and log-probability equal stage 2's")
