#!/usr/bin/env python3
"""The GRPO main job with its training side in Python (run_grpo.py --python-train: examples/python/grpo_train.py on
the tessera package) against the C++ main job, the oracle: the same options and seed, the same C++ rollout job.
Both training sides run the same operations in the same order, so every step's mean reward, loss, training-vs-
rollout log-prob mismatch, the samples' mean negative log-prob, per-position accuracies and policy entropy must be
equal as printed (6 significant digits), and the final weights (each job's checkpoint consolidated by `tessera
checkpoint consolidate`) bit for bit. Stage 2 and stage 3. Negative control: a C++ run with the lr changed by 1% differs.
With `offload`: the C++ and the Python training sides with the optimizer offloaded to host memory (--offload cpu),
and the C++ side moving all its states to host memory while the rollout job generates (--offload-states), against
the C++ main job without offload, the same comparisons.
Usage: grpo_python.py BUILD_DIR PORT [offload]"""
import os
import subprocess
import sys
import tempfile

build, port = sys.argv[1], int(sys.argv[2])
offload = sys.argv[3:] == ["offload"]
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 20
COMPARED = ["reward", "loss", "logprob_mismatch", "neg_logprob", "acc1", "acc2", "acc3", "entropy"]


def run(out, port, python, stage, lr=None, offload=False, flags=()):
    extra = ["--steps", str(STEPS), "--seed", "5", "--zero-stage", str(stage), "--checkpoint-dir",
             os.path.join(out, "ckpt")] + (["--lr", lr] if lr else []) + (["--offload", "cpu"] if offload else []) + list(flags)
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "grpo", "run_grpo.py"), "--build", build,
                        "--port", str(port), "--out", out] + (["--python-train"] if python else []) + ["--"] + extra,
                       timeout=600, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"grpo_python: run_grpo.py ({'python' if python else 'C++'}, stage {stage}) exited {r.returncode}")
    lines = [l.strip().split(",") for l in open(os.path.join(out, "grpo.csv"))]
    header, rows = lines[0], lines[1:]
    if len(rows) != STEPS:
        sys.exit(f"grpo_python: {len(rows)} steps in {out}/grpo.csv")
    curve = {name: [r[i] for r in rows] for i, name in enumerate(header)}
    # The final policy, whole: the checkpoint consolidated by the project's CLI (the weights' bytes).
    subprocess.run([os.path.join(build, "tools", "tessera"), "checkpoint", "consolidate", os.path.join(out, "ckpt"),
                    os.path.join(out, "weights")], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "weights", "model.safetensors"), "rb") as f:
        curve["weights"] = f.read()
    return curve


def differences(a, b):
    return [(name, step + 1, a[name][step], b[name][step]) for name in COMPARED for step in range(STEPS)
            if a[name][step] != b[name][step]]


def compare(what, stage, run_, oracle_):
    diff = differences(run_, oracle_)
    if run_["weights"] != oracle_["weights"]:
        failures.append(f"stage {stage}: the final weights of {what} differ from the C++ job's")
    if diff:
        failures.append(f"stage {stage}: {what} differs from the C++ one: {diff[:5]}")
    else:
        print(f"grpo_python: stage {stage}: {what}: {STEPS} steps equal (rewards {run_['reward'][0]} .. {run_['reward'][-1]})")


failures, oracle = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for i, stage in enumerate((2, 3)):
        base = port + 3 * i
        cpp = oracle[stage] = run(os.path.join(tmp, f"cpp{stage}"), base, False, stage)
        compare("the Python training side" + (" offloaded" if offload else ""), stage,
                run(os.path.join(tmp, f"py{stage}"), base + 1, True, stage, offload=offload), cpp)
        if offload:
            compare("the C++ training side offloaded", stage,
                    run(os.path.join(tmp, f"cpp_offload{stage}"), base + 2, False, stage, offload=True), cpp)
            # Colocated: every state to host memory while the rollout job generates, back for the update.
            compare("the C++ training side with offload_states around generation", stage,
                    run(os.path.join(tmp, f"cpp_states{stage}"), base + 6, False, stage, flags=["--offload-states"]), cpp)
    if not offload:
        perturbed = run(os.path.join(tmp, "perturbed"), port + 6, False, 2, lr="0.00101")
        if not differences(perturbed, oracle[2]) or perturbed["weights"] == oracle[2]["weights"]:
            failures.append("negative control: a run with another lr printed the same curve")
if failures:
    sys.exit("grpo_python: " + "; ".join(failures))
print("grpo_python: ok (" + ("the offloaded training sides reproduce" if offload else "the Python training side reproduces") +
      " the C++ main job at stages 2 and 3)")
