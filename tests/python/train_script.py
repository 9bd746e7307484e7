#!/usr/bin/env python3
"""examples/python/train.py, a DeepSpeed script whose one change is `import tessera as deepspeed`, run as users run
it (tools/tessera-launch, 2 ranks) at ZeRO stages 0-3 for 30 steps, each run exporting its weights
(save_16bit_model, fp32). The oracle, in this process: the same model, data and sampler order (each rank's
DistributedSampler share, as DeepSpeed's dataloader reads it), both ranks' gradients averaged, torch.optim.AdamW with
the config's settings. Every exported tensor must equal the oracle's bit for bit (so the four stages equal each
other too). Negative control: the oracle with beta2 changed differs. Usage: train_script.py PORT"""
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import train  # noqa: E402
from hf_dir import read_safetensors  # noqa: E402
from pytorch_oracle import train_averaged  # noqa: E402

port, STEPS, WORLD = int(sys.argv[1]), 30, 2
CONFIG = json.load(open(os.path.join(ROOT, "examples", "python", "ds_config.json")))


def oracle(beta2=None):
    args = train.parse_args(["--deepspeed_config", "unused"])
    model, data, vocab = train.model_and_data(args)
    micro = CONFIG["train_micro_batch_size_per_gpu"]
    shares = [list(torch.utils.data.DistributedSampler(data, num_replicas=WORLD, rank=r)) for r in range(WORLD)]
    batches = [[torch.stack([data[i] for i in share[s * micro:(s + 1) * micro]]) for s in range(STEPS)]
               for share in shares]
    p = CONFIG["optimizer"]["params"]
    adamw = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=(p["betas"][0], beta2 or p["betas"][1]),
                              eps=p["eps"], weight_decay=p["weight_decay"])
    weights = train_averaged(model, adamw, lambda m, step, r: train.loss_of(m, batches[r][step], vocab), STEPS, WORLD)
    return dict(zip([n for n, _ in model.named_parameters()], weights))


failures = []
expected = oracle()
with tempfile.TemporaryDirectory() as tmp:
    for stage in (0, 1, 2, 3):
        config = dict(CONFIG, zero_optimization=dict(CONFIG["zero_optimization"], stage=stage))
        path = os.path.join(tmp, f"ds_config_stage{stage}.json")
        json.dump(config, open(path, "w"))
        out = os.path.join(tmp, f"stage{stage}")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tessera-launch"), "--nproc-per-node", str(WORLD),
                            "--master-port", str(port + stage), "--grace-period", "2", "--", sys.executable,
                            os.path.join(ROOT, "examples", "python", "train.py"), "--deepspeed_config", path,
                            "--steps", str(STEPS), "--save-dir", out], timeout=300)
        if r.returncode != 0:
            failures.append(f"stage {stage}: train.py exited {r.returncode}")
            continue
        got = read_safetensors(os.path.join(out, "model.safetensors"))
        if sorted(got) != sorted(expected):
            failures.append(f"stage {stage}: exported {sorted(got)}")
        bad = [n for n in expected if n in got and not torch.equal(got[n], expected[n])]
        if bad:
            failures.append(f"stage {stage}: {len(bad)} tensors differ from the oracle, e.g. {bad[0]} by "
                            f"{(got[bad[0]] - expected[bad[0]]).abs().max().item()}")
perturbed = oracle(beta2=0.951)
if all(torch.equal(perturbed[n], expected[n]) for n in expected):
    failures.append("negative control: the perturbed oracle equals the oracle")
if failures:
    sys.exit("train_script: " + "; ".join(failures))
print(f"train_script ok: examples/python/train.py at stages 0-3 equals the PyTorch oracle bit for bit after {STEPS} steps")
