#!/usr/bin/env python3
"""train_lm with the offload presets as users run them: configs/zero2_offload_cpu.toml,
configs/zero3_offload_cpu.toml (optimizer and parameters in host memory),
configs/zero3_offload_partial.toml (half the optimizer's sub-groups on the host; sub-groups made
small enough for the test's model to have several) and LLaMA-Factory's
ds_z2_offload_config.json, ds_z3_offload_config.json and ds_z3_partial_offload_config.json
(configs/deepspeed/) as shipped, and configs/zero3_offload_nvme.toml with only its nvme_path pointed
at a scratch directory, each against the same file with the offload blocks' devices set to "none";
also ds_z3_offload_config.json with its parameters sent to NVMe (offload_param.device "nvme", the
scratch directory as nvme_path). 2 ranks, 3 steps, a checkpoint at the
end: every tensor of the run without offload's checkpoint (weights, fp32 masters, Adam states) is in
the offloaded run's, byte for byte (in fp32 the offloaded run also saves its host master: the
weights' bytes, or at stage 3 a slice of them); the NVMe run leaves no swap file behind. Negative
control: the host-memory preset with another lr writes other bytes.
Usage: offload_test.py LAUNCH TRAIN_LM SOURCE_DIR PORT"""
import filecmp
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

launch, train_lm, source, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
work = tempfile.mkdtemp(prefix="tessera_train_lm_offload_")
MODEL = ["--d-model", "64", "--heads", "4", "--layers", "2", "--context", "32", "--steps", "3"]
runs = 0


def run(config, ckpt, fails=False):
    global runs
    runs += 1
    cmd = [sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(port + runs), "--job",
           f"train_lm_offload_{runs}", "--", train_lm, "--config", config, "--checkpoint-dir", ckpt, "--csv", ""] + MODEL
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if (p.returncode != 0) != fails:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def tensor_files(ckpt):
    tag = os.path.join(ckpt, "global_step3")
    names = sorted(n for n in os.listdir(tag) if n.endswith(".safetensors"))
    if not names:
        sys.exit(f"{tag}: no safetensors files")
    return tag, names


def tensors(path):  # safetensors: name -> raw bytes
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return {k: blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__"}


def write(name, text):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def without_offload(text):
    out, n = re.subn(r'(\[zero_optimization\.offload_optimizer\]\s*\ndevice\s*=\s*)"(cpu|nvme)"', r'\1"none"', text)
    if n != 1:
        sys.exit("the preset's offload_optimizer.device was not found")
    out, n = re.subn(r'(\[zero_optimization\.offload_param\]\s*\ndevice\s*=\s*)"(cpu|nvme)"', r'\1"none"', out)
    if n > 1:
        sys.exit("the preset has more than one offload_param.device")
    return out


try:
    swap = os.path.join(work, "nvme")
    os.mkdir(swap)
    presets = []
    with open(os.path.join(source, "configs", "zero2_offload_cpu.toml")) as f:
        cpu = f.read()
    presets.append(("zero2_offload_cpu", os.path.join(source, "configs", "zero2_offload_cpu.toml"),
                    write("zero2_none.toml", without_offload(cpu))))
    with open(os.path.join(source, "configs", "zero3_offload_cpu.toml")) as f:
        zero3_cpu = f.read()
    if '[zero_optimization.offload_param]\ndevice = "cpu"' not in zero3_cpu:
        sys.exit("zero3_offload_cpu.toml: its parameters are not offloaded")
    presets.append(("zero3_offload_cpu", os.path.join(source, "configs", "zero3_offload_cpu.toml"),
                    write("zero3_cpu_none.toml", without_offload(zero3_cpu))))
    # Partial offload as shipped but for its sub_group_size: the test's model is far below 1e8
    # elements a rank, so sub-groups of 2000 give it a host share and a device share to split.
    with open(os.path.join(source, "configs", "zero3_offload_partial.toml")) as f:
        partial, n = re.subn(r"sub_group_size = 1e8", "sub_group_size = 2000", f.read())
    if n != 1 or "ratio = 0.5" not in partial:
        sys.exit("zero3_offload_partial.toml: no sub_group_size = 1e8 or no ratio = 0.5")
    presets.append(("zero3_offload_partial", write("zero3_partial.toml", partial),
                    write("zero3_partial_none.toml", without_offload(partial))))
    with open(os.path.join(source, "configs", "zero3_offload_nvme.toml")) as f:
        nvme = f.read().replace('"/local_nvme"', f'"{swap}"')
    presets.append(("zero3_offload_nvme", write("zero3_nvme.toml", nvme), write("zero3_none.toml", without_offload(nvme))))
    for name in ("llamafactory_ds_z2_offload_config", "llamafactory_ds_z3_offload_config",
                 "llamafactory_ds_z3_partial_offload_config"):
        path = os.path.join(source, "configs", "deepspeed", name + ".json")
        with open(path) as f:
            ds = json.load(f)
        if ds["zero_optimization"]["offload_optimizer"]["device"] != "cpu":
            sys.exit(f"{path}: its optimizer is not offloaded")
        ds["zero_optimization"]["offload_optimizer"]["device"] = "none"
        if "offload_param" in ds["zero_optimization"]:
            ds["zero_optimization"]["offload_param"]["device"] = "none"
        presets.append((name, path, write(name + "_none.json", json.dumps(ds))))
    with open(os.path.join(source, "configs", "deepspeed", "llamafactory_ds_z3_offload_config.json")) as f:
        ds = json.load(f)
    ds["zero_optimization"]["offload_param"].update(device="nvme", nvme_path=swap)
    presets.append(("llamafactory_ds_z3_offload_config_param_nvme", write("z3_param_nvme.json", json.dumps(ds)),
                    os.path.join(work, "llamafactory_ds_z3_offload_config_none.json")))
    for name, offloaded, plain in presets:
        a, b = os.path.join(work, name + "_offload"), os.path.join(work, name + "_none")
        out = run(offloaded, a)
        if "done: 3 steps" not in out:
            sys.exit(f"{name}: did not finish:\n{out}")
        run(plain, b)
        (ta, fa), (tb, fb) = tensor_files(a), tensor_files(b)
        if fa != fb:
            sys.exit(f"{name}: checkpoint files differ: {fa} against {fb}")
        compared = 0
        for n in fa:
            ra, rb = tensors(os.path.join(ta, n)), tensors(os.path.join(tb, n))
            for key, raw in rb.items():
                if ra.get(key) != raw:
                    sys.exit(f"{name}: {n}: '{key}' differs from the run without offload")
                compared += 1
            # In fp32 the weights are their own master on the device; offloaded, the host master is
            # a copy, saved too: it must be the weights' bytes (at stage 3 this rank's partition of
            # them, a slice of the weights this file holds).
            for key in set(ra) - set(rb):
                weights = rb.get("param/" + key.split("/", 1)[1], b"")
                if not key.startswith("master/") or not ra[key] or ra[key] not in weights:
                    sys.exit(f"{name}: {n}: '{key}' only with offload, and not the weights' copy")
        print(f"{name}: {compared} checkpoint tensors equal to the run without offload")
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
