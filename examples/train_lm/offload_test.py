#!/usr/bin/env python3
"""train_lm with the offload presets as users run them: configs/zero2_offload_cpu.toml as shipped and
configs/zero3_offload_nvme.toml with only its nvme_path pointed at a scratch directory, each against
the same file with the offload block's device set to "none". 2 ranks, 3 steps, a checkpoint at the
end: every safetensors file of the offloaded run's checkpoint (weights, fp32 masters, Adam states)
equals the one without offload byte for byte; the NVMe run leaves no swap file behind. Negative
control: the host-memory preset with another lr writes other bytes.
Usage: offload_test.py LAUNCH TRAIN_LM SOURCE_DIR PORT"""
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile

launch, train_lm, source, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
work = tempfile.mkdtemp(prefix="tessera_train_lm_offload_")
MODEL = ["--d-model", "64", "--heads", "4", "--layers", "2", "--context", "32", "--steps", "3"]
runs = 0


def run(config, ckpt):
    global runs
    runs += 1
    cmd = [sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(port + runs), "--job",
           f"train_lm_offload_{runs}", "--", train_lm, "--config", config, "--checkpoint-dir", ckpt, "--csv", ""] + MODEL
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def tensor_files(ckpt):
    tag = os.path.join(ckpt, "global_step3")
    names = sorted(n for n in os.listdir(tag) if n.endswith(".safetensors"))
    if not names:
        sys.exit(f"{tag}: no safetensors files")
    return tag, names


def write(name, text):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def without_offload(text):
    out, n = re.subn(r'(\[zero_optimization\.offload_optimizer\]\s*\ndevice\s*=\s*)"(cpu|nvme)"', r'\1"none"', text)
    if n != 1:
        sys.exit("the preset's offload_optimizer.device was not found")
    return out


try:
    swap = os.path.join(work, "nvme")
    os.mkdir(swap)
    presets = []
    with open(os.path.join(source, "configs", "zero2_offload_cpu.toml")) as f:
        cpu = f.read()
    presets.append(("zero2_offload_cpu", os.path.join(source, "configs", "zero2_offload_cpu.toml"),
                    write("zero2_none.toml", without_offload(cpu))))
    with open(os.path.join(source, "configs", "zero3_offload_nvme.toml")) as f:
        nvme = f.read().replace('"/local_nvme"', f'"{swap}"')
    presets.append(("zero3_offload_nvme", write("zero3_nvme.toml", nvme), write("zero3_none.toml", without_offload(nvme))))
    for name, offloaded, plain in presets:
        a, b = os.path.join(work, name + "_offload"), os.path.join(work, name + "_none")
        out = run(offloaded, a)
        if "done: 3 steps" not in out:
            sys.exit(f"{name}: did not finish:\n{out}")
        run(plain, b)
        (ta, fa), (tb, fb) = tensor_files(a), tensor_files(b)
        if fa != fb:
            sys.exit(f"{name}: checkpoint files differ: {fa} against {fb}")
        for n in fa:
            if not filecmp.cmp(os.path.join(ta, n), os.path.join(tb, n), shallow=False):
                sys.exit(f"{name}: {n} differs from the run without offload")
        print(f"{name}: {len(fa)} checkpoint files equal to the run without offload")
    if "lr = 2e-5" not in cpu:
        sys.exit("zero2_offload_cpu.toml: no 'lr = 2e-5' for the negative control")
    control = os.path.join(work, "control")
    run(write("zero2_lr.toml", cpu.replace("lr = 2e-5", "lr = 3e-5")), control)
    ta, fa = tensor_files(os.path.join(work, "zero2_offload_cpu_offload"))
    tc, fc = tensor_files(control)
    if all(filecmp.cmp(os.path.join(ta, n), os.path.join(tc, n), shallow=False) for n in fa):
        sys.exit("negative control: another lr wrote the same checkpoint")
    left = os.listdir(swap)
    if left:
        sys.exit(f"swap files left behind in {swap}: {left}")
    print("train_lm offload presets: ok")
finally:
    shutil.rmtree(work, ignore_errors=True)
