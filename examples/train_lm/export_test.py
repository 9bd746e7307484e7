#!/usr/bin/env python3
"""train_lm --save-dir as users run it: 2 ranks train tiny-qwen3 for 5 steps at ZeRO stages 0-3 and export
through save_16bit_model (every rank writing its own bytes). Each export is read back with a plain Python
safetensors reader (json + struct, no tessera, no torch): config.json beside it, the header's offsets tiling the
data, every tensor of the config's model present once with its shape. In fp32 the stages train the same
weights bit for bit at 2 ranks, so the four exports' tensor bytes must be identical: an export that lost,
duplicated or misplaced any rank's bytes differs from the others. A bf16 export carries BF16 tensors.
Usage: export_test.py LAUNCH TRAIN_LM CONFIG MODEL_CONFIG PORT"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

launch, train_lm, base_config, model_config, port = sys.argv[1:6]
work = tempfile.mkdtemp(prefix="tessera_train_lm_export_")
# train_lm.toml with one micro-step per update and no clipping: stage 2 adds each micro-step's reduced
# gradients into its partition ((a1 + b1) + (a2 + b2) where stage 0 reduces a1 + a2 with b1 + b2), and the
# clipping norm is summed over other partitions at each stage: with either, the stages agree only up to
# rounding (seen: stage 2's embedding differs in its last bits).
config = os.path.join(work, "train_lm.toml")
with open(base_config) as f:
    text = f.read()
if "gradient_accumulation_steps = 2" not in text:
    sys.exit(f"{base_config}: expected gradient_accumulation_steps = 2")
with open(config, "w") as f:
    f.write(text.replace("gradient_accumulation_steps = 2", "gradient_accumulation_steps = 1")
            .replace("gradient_clipping = 1.0", "gradient_clipping = 0.0"))
runs = 0


def run(*args):
    global runs
    runs += 1
    cmd = [sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(int(port) + runs), "--job",
           f"train_lm_export_{runs}", "--", train_lm, "--config", config, "--model-config", model_config,
           "--steps", "5", "--context", "32", "--csv", ""] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def read_safetensors(path):
    """name -> (dtype, shape, bytes), checking that the offsets tile the data section."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            sys.exit(f"{path}: '{name}' starts at {begin}, the previous tensor ends at {end}")
        end = stop
    if end != len(data):
        sys.exit(f"{path}: tensors end at {end}, the data section has {len(data)} bytes")
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def read_export(d):
    if not os.path.exists(os.path.join(d, "config.json")):
        sys.exit(f"{d}: no config.json")
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        for name, t in read_safetensors(os.path.join(d, f)).items():
            if name in tensors:
                sys.exit(f"{d}: '{name}' is in two files")
            tensors[name] = t
    return tensors


try:
    exports = {}
    for stage in range(4):
        d = os.path.join(work, f"stage{stage}")
        out = run("--zero-stage", str(stage), "--save-dir", d)
        if "saved the model to" not in out:
            sys.exit(f"stage {stage}: no export reported:\n{out}")
        exports[stage] = read_export(d)
    hidden = json.load(open(os.path.join(work, "stage0", "config.json")))["hidden_size"]
    base = exports[0]
    if base["model.embed_tokens.weight"][1][1] != hidden or any(t[0] != "F32" for t in base.values()):
        sys.exit("stage 0: the embedding's shape or the dtype is not the config's")
    for stage in (1, 2, 3):
        if exports[stage].keys() != base.keys():
            sys.exit(f"stage {stage}: tensors {sorted(exports[stage].keys() ^ base.keys())} differ from stage 0's")
        for name, t in base.items():
            if exports[stage][name] != t:
                sys.exit(f"stage {stage}: '{name}' differs from stage 0's export")
    d = os.path.join(work, "bf16")
    run("--zero-stage", "3", "--mixed-precision", "bf16", "--save-dir", d)
    bf16 = read_export(d)
    if bf16.keys() != base.keys() or any(t[0] != "BF16" for t in bf16.values()):
        sys.exit("the bf16 export does not hold BF16 tensors of every parameter")
    print(f"train_lm export: ok ({len(base)} tensors; stages 0-3 byte-identical in fp32; bf16 at stage 3)")
finally:
    shutil.rmtree(work, ignore_errors=True)
