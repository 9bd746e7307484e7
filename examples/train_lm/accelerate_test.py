#!/usr/bin/env python3
"""train_lm under `tessera-launch --config_file configs/accelerate/zero3_plugin.yaml` (Accelerate's DeepSpeed
plugin: ZeRO-3, optimizer offloaded to the host, bf16, the model built partitioned) trains exactly as the
same run given, by hand, the DeepSpeed JSON that plugin stands for (accelerate_oracle_zero3.json, written
from Accelerate's documentation): the same loss curve and the same saved weights, byte for byte. Negative
control: the plugin with gradient_accumulation_steps 2 gives another curve. A --config that agrees with the
plugin runs the same; one whose stage contradicts it is refused. Usage: accelerate_test.py LAUNCH TRAIN_LM ROOT PORT"""
import os
import subprocess
import sys
import tempfile

launch, train_lm, root, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
MODEL = ["--model-config", os.path.join(root, "configs/models/tiny-qwen3"), "--steps", "4", "--context", "32",
         "--micro-batch", "4"]
PLUGIN = os.path.join(root, "configs/accelerate/zero3_plugin.yaml")
ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_oracle_zero3.json")
runs = 0


def run(launch_args, train_args, expect_ok=True):
    global runs
    runs += 1
    cmd = [sys.executable, launch] + launch_args + ["--master-port", str(port + runs), "--job", f"train_lm_acc_{runs}",
                                                     "--", train_lm] + MODEL + train_args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if expect_ok and p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def curve(path):  # step -> (loss, lr, scale) as printed
    with open(path) as f:
        return {line.split(",")[0]: line.split(",")[1:4] for line in list(f)[1:]}


def weights(directory):
    with open(os.path.join(directory, "model.safetensors"), "rb") as f:
        return f.read()


def expect(cond, what):
    if not cond:
        sys.exit(what)


with tempfile.TemporaryDirectory(prefix="tessera_train_lm_accelerate_") as work:
    a = run(["--config_file", PLUGIN], ["--csv", f"{work}/plugin.csv", "--save-dir", f"{work}/plugin"])
    expect("config from " + PLUGIN + " (Accelerate's DeepSpeed plugin); model built partitioned" in a.stdout,
           "train_lm did not report the plugin's config and zero3_init_flag:\n" + a.stdout)
    expect("world 2, ZeRO stage 3" in a.stdout, "not 2 ranks at stage 3 (num_processes, zero_stage):\n" + a.stdout)
    b = run(["--nproc-per-node", "2"], ["--config", ORACLE, "--csv", f"{work}/oracle.csv", "--save-dir", f"{work}/oracle"])
    expect("config from" not in b.stdout, "the oracle run took a launcher config")
    ca, cb = curve(f"{work}/plugin.csv"), curve(f"{work}/oracle.csv")
    expect(sorted(ca) == ["1", "2", "3", "4"] and ca == cb, f"curves differ:\nplugin {ca}\noracle {cb}")
    expect(weights(f"{work}/plugin") == weights(f"{work}/oracle"), "the saved weights differ")

    # Negative control: a plugin setting that changes training changes the curve.
    with open(PLUGIN) as f:
        text = f.read().replace("gradient_accumulation_steps: 1", "gradient_accumulation_steps: 2")
    accum = os.path.join(work, "accum2.yaml")
    with open(accum, "w") as f:
        f.write(text)
    run(["--config_file", accum], ["--csv", f"{work}/accum2.csv"])
    expect(curve(f"{work}/accum2.csv") != ca, "gradient_accumulation_steps 2 left the curve unchanged")

    # A program config of its own beside the plugin: where they agree (the oracle file) it runs; a stage that
    # contradicts the file's zero_stage is refused, naming both, since one of them would be ignored.
    c = run(["--config_file", PLUGIN], ["--config", ORACLE, "--csv", f"{work}/both.csv"])
    expect(curve(f"{work}/both.csv") == ca, "the plugin beside an agreeing --config changed the curve")
    with open(ORACLE) as f:
        text = f.read().replace('"stage": 3', '"stage": 2')
    stage2 = os.path.join(work, "stage2.json")
    with open(stage2, "w") as f:
        f.write(text)
    c = run(["--config_file", PLUGIN], ["--config", stage2, "--csv", ""], expect_ok=False)
    out = c.stdout + c.stderr
    expect(c.returncode != 0 and "disagree" in out and "zero_optimization.stage is 2 in " + stage2 + " but 3" in out,
           f"a contradicting --config beside the plugin was not refused (exit {c.returncode}):\n{out[-2000:]}")
print("train_lm accelerate: ok (plugin run equals the hand-written DeepSpeed JSON: curve and weights)")
