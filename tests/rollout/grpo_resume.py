#!/usr/bin/env python3
"""The GRPO main job saves and resumes exactly, at another ZeRO stage (grpo --checkpoint-dir,
--save-every, --stop-at, --resume; examples/grpo/grpo_checkpoint.h).

  A: 8 steps at stage 2 with a KL term and delta syncs, never stopped (the oracle);
  B: the same run, saving every 2 steps, stopped after step 4 as a preempted job would be;
  C: resumed from B's checkpoint at ZeRO stage 3 (its KL reference then a ZeRO inference engine),
     to step 8.
Every step's reward, KL, loss, log-probabilities, lr, entropy and per-position accuracy of B then C
must equal A's as printed (stage 3 equals stage 2 bit for bit, sampling is a function of the seed
and the step, so any state the checkpoint lost or restored wrongly shows as a difference), and so
must each step's sync kind (full or delta): C's first sync, before its step 5, is a full one (a
new sender has no version to build on). A resume of a run already at
its total exits 0 at once.
Usage: grpo_resume.py BUILD_DIR PORT (uses PORT .. PORT + 3)"""
import os
import subprocess
import sys
import tempfile

build, port = sys.argv[1], int(sys.argv[2])
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# changed_elements is training rank 0's own count (its share at stage 3), so it is not compared.
COMPARED = ("reward", "kl", "loss", "logprob_mismatch", "lr", "neg_logprob", "clip_frac", "entropy", "delta")


def run(out, port, *extra):
    args = ["--steps", "8", "--seed", "5", "--kl-beta", "0.05", "--delta"] + list(extra)
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "grpo", "run_grpo.py"), "--build", build,
                        "--port", str(port), "--out", out, "--"] + args, timeout=600, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        sys.exit(f"grpo_resume: run_grpo.py {' '.join(args)} exited {r.returncode}")
    lines = [l.strip().split(",") for l in open(os.path.join(out, "grpo.csv"))]
    header, rows = lines[0], lines[1:]
    return r.stdout, [dict(zip(header, row)) for row in rows]


with tempfile.TemporaryDirectory() as a_out, tempfile.TemporaryDirectory() as b_out:
    _, oracle = run(a_out, port)
    ckpt = os.path.join(b_out, "ckpt")
    _, stopped = run(b_out, port + 1, "--checkpoint-dir", ckpt, "--save-every", "2", "--stop-at", "4")
    if len(stopped) != 4:
        sys.exit(f"grpo_resume: the stopped run wrote {len(stopped)} steps, not 4")
    if not os.path.isfile(os.path.join(ckpt, "reference", "model.safetensors")):
        sys.exit("grpo_resume: the KL reference was not saved")
    with open(os.path.join(ckpt, "latest")) as f:
        latest = f.read().strip()
    log, both = run(b_out, port + 2, "--checkpoint-dir", ckpt, "--resume", "--zero-stage", "3")
    if "resumed from" not in log or "at GRPO step 4" not in log:
        sys.exit("grpo_resume: the resumed run did not say it resumed at step 4")
    if len(both) != 8 or [r["step"] for r in both] != [str(s) for s in range(1, 9)]:
        sys.exit(f"grpo_resume: the curve after the resume has steps {[r['step'] for r in both]}, not 1..8")
    compared = COMPARED + tuple(k for k in oracle[0] if k.startswith("acc"))
    differences = [f"step {i + 1} {k}: {b[k]} after stop/resume, {a[k]} uninterrupted"
                   for i, (a, b) in enumerate(zip(oracle, both)) for k in compared if a[k] != b[k]]
    if differences:
        sys.exit("grpo_resume: the resumed run differs from the uninterrupted one:\n  " + "\n  ".join(differences[:10]))
    # Already at the total: both jobs end at once, successfully, and the curve is unchanged.
    log, again = run(b_out, port + 3, "--checkpoint-dir", ckpt, "--resume")
    if "nothing to train" not in log or len(again) != 8:
        sys.exit("grpo_resume: a resume at the total did not end at once")
    print(f"grpo_resume: stopped at step 4 ({latest}), resumed at ZeRO-3: steps 5-8 equal the uninterrupted run's in "
          f"{len(compared)} columns")
