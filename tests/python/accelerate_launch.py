#!/usr/bin/env python3
"""tessera.initialize under `tessera-launch --config_file accelerate_zero1.yaml`: the script takes the launcher's
config (tessera.utils.launch_config(): the plugin's ZeRO-1, clipping 0.5), fills its "auto" batch sizes, and trains a client AdamW to the weights of the single-process
PyTorch oracle with the same clipping, bit for bit (negative control: the oracle without clipping differs);
a config= of the script's own has its "auto" values filled from the file and a contradicting value refused,
naming it; zero.init_flag() is the file's zero3_init_flag (absent: False). Usage: tessera-launch --config_file accelerate_zero1.yaml -- python3 ..."""
import torch

import tessera
from checks import Checks
from mlp_task import model_of, mse_loss
from pytorch_oracle import ClippedAdamW, train_averaged

STEPS, MICRO, LR = 5, 4, 1e-2
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


def loss_of(model, step, r):
    return mse_loss(model, step, r, MICRO)


def oracle(clip):
    model = model_of()
    optimizer = ClippedAdamW(model.parameters(), clip, lr=LR) if clip else torch.optim.AdamW(model.parameters(), lr=LR)
    return train_averaged(model, optimizer, loss_of, STEPS, world)


expect(world == 2, f"num_processes 2 gave {world} ranks")
expect(not tessera.zero.init_flag(), "zero3_init_flag is not in the file, yet init_flag() is True")
# What the launcher handed over is the plugin's config; its "auto" batch sizes are the script's to fill (as
# Accelerate's prepare() does from the data loader).
config = tessera.utils.launch_config()
expect(config is not None and config["zero_optimization"] == {"stage": 1} and config["gradient_clipping"] == 0.5 and
       config["train_micro_batch_size_per_gpu"] == "auto", f"the launcher's config: {config}")
model = model_of()
# Without config= initialize takes the launcher's as it is: its "auto" micro batch has no one to fill it.
check.expect_error(tessera.ConfigError, ["train_micro_batch_size_per_gpu", "auto"],
                   lambda: tessera.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=LR)))
config["train_micro_batch_size_per_gpu"], config["train_batch_size"] = MICRO, MICRO * world
engine, _, _, _ = tessera.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=LR), config=config)
expect(engine.zero_optimization_stage() == 1, f"stage {engine.zero_optimization_stage()}, the file says 1")
for step in range(STEPS):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
with engine.gathered_parameters():
    got = [p.detach().clone() for p in model.parameters()]
clipped = oracle(0.5)
expect(all(torch.equal(a, b) for a, b in zip(got, clipped)), "the weights differ from the clipped oracle's")
expect(not all(torch.equal(a, b) for a, b in zip(oracle(None), clipped)), "negative control: clipping changed nothing")
engine.destroy()

# A config of the script's own: "auto" stage filled from the file; a stage that contradicts it refused.
other = model_of()
mine = {"train_micro_batch_size_per_gpu": MICRO, "zero_optimization": {"stage": "auto"}}  # clipping left out: the file's
engine, _, _, _ = tessera.initialize(model=other, optimizer=torch.optim.AdamW(other.parameters(), lr=LR), config=mine)
expect(engine.zero_optimization_stage() == 1, f"an \"auto\" stage beside the file's zero_stage 1 became {engine.zero_optimization_stage()}")
engine.destroy()
mine["zero_optimization"]["stage"] = 2
check.expect_error(tessera.ConfigError, ["disagree", "zero_optimization.stage is 2", "but 1 in the Accelerate file"],
                   lambda: tessera.initialize(model=model_of(), config=mine))
check.finish("python accelerate launch ok")
