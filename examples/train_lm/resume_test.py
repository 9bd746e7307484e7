#!/usr/bin/env python3
"""train_lm's checkpoints as users run them: 2 ranks at stage 2 stop after 4 of 6 steps, saving every 2;
resumed at the same layout they reach step 6 with the loss curve of an uninterrupted 6-step run
(the CSV lines of steps 5 and 6, losses and lrs as printed); resumed at 1 rank, stage 3 (the same
global batch) they reach step 6 too; a run already at its total says so and exits 0.
Usage: resume_test.py LAUNCH TRAIN_LM CONFIG PORT"""
import os
import shutil
import subprocess
import sys
import tempfile

launch, train_lm, config, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
work = tempfile.mkdtemp(prefix="tessera_train_lm_resume_")
MODEL = ["--d-model", "64", "--heads", "4", "--layers", "2", "--context", "32"]
runs = 0


def run(nproc, *args):
    global runs
    runs += 1
    cmd = [sys.executable, launch, "--nproc-per-node", str(nproc), "--master-port", str(port + runs), "--job",
           f"train_lm_resume_{runs}", "--", train_lm, "--config", config] + MODEL + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def curve(path):  # step -> (loss, lr, scale) as printed
    with open(path) as f:
        return {line.split(",")[0]: line.split(",")[1:4] for line in list(f)[1:]}


def expect(cond, what):
    if not cond:
        sys.exit(what)


try:
    ck, same, full, other = (os.path.join(work, n) for n in ("ckpt", "same.csv", "full.csv", "other.csv"))
    run(2, "--steps", "6", "--csv", full)
    out = run(2, "--steps", "6", "--stop-at", "4", "--checkpoint-dir", ck, "--save-every", "2", "--csv", same)
    expect("saved checkpoint" in out and os.path.isdir(os.path.join(ck, "global_step2")) and
           os.path.isdir(os.path.join(ck, "global_step4")), "no checkpoints at steps 2 and 4:\n" + out)
    shutil.copytree(ck, ck + "_other")
    out = run(2, "--steps", "6", "--checkpoint-dir", ck, "--resume", "--csv", same)
    expect("resumed from" in out and "at step 4" in out, "not resumed at step 4:\n" + out)
    a, b = curve(full), curve(same)
    expect(sorted(b) == ["1", "2", "3", "4", "5", "6"], f"the resumed curve has steps {sorted(b)}")
    for step in ("5", "6"):
        expect(a[step] == b[step], f"step {step}: uninterrupted {a[step]}, resumed {b[step]}")
    # Another world size and stage, the same global batch (2 x 8 = 1 x 16).
    out = run(1, "--steps", "6", "--checkpoint-dir", ck + "_other", "--resume", "--zero-stage", "3", "--micro-batch", "16",
              "--csv", other)
    expect("at step 4" in out and "step 6/6" in out, "the resume at 1 rank, stage 3 did not finish:\n" + out)
    out = run(2, "--steps", "6", "--checkpoint-dir", ck, "--resume", "--csv", "")
    expect("already at step 6 of 6" in out, "a finished run trained again:\n" + out)
    print("train_lm resume: ok (steps 5-6 as uninterrupted; resumed at 1 rank, stage 3)")
finally:
    shutil.rmtree(work, ignore_errors=True)
