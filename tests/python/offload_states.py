#!/usr/bin/env python3
"""engine.offload_states()/reload_states() from Python (DeepSpeed's names), 2 ranks, against the single-process
PyTorch oracle: at stages 1 and 3, 3 steps, every state offloaded (each parameter's storage then has no bytes,
the bytes moved are reported per state), reloaded, 3 more steps: the oracle's 6-step weights bit for bit; only
optim_states moved leaves the weights' memory alone; step() while offloaded raises naming reload_states; an unknown
state name is refused. Negative control: the oracle at 5 steps differs. Usage: tessera-launch --nproc-per-node 2 python3 ..."""
import torch

import tessera
from checks import Checks
from mlp_task import model_of, mse_loss
from pytorch_oracle import train_averaged

STEPS, MICRO, LR = 3, 4, 2e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


def loss_of(model, step, r):
    return mse_loss(model, step, r, MICRO)


def config(stage):
    return {"train_micro_batch_size_per_gpu": MICRO,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "tessera": {"transport": {"collective_timeout_ms": 30000}}}


def storage_bytes(model):
    return sum(p.storage().nbytes() for p in model.parameters())


def oracle(steps):
    model = model_of()
    adamw = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    return train_averaged(model, adamw, loss_of, steps, world)


want = oracle(2 * STEPS)
expect(any(not torch.equal(a, b) for a, b in zip(oracle(2 * STEPS - 1), want)), "negative control: 5 steps equal 6")
for stage in (1, 3):
    model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, config=config(stage))
    for step in range(STEPS):
        engine.backward(loss_of(engine, step, rank))
        engine.step()
    moved = engine.offload_states()
    expect(storage_bytes(model) == 0, f"stage {stage}: the weights kept {storage_bytes(model)} bytes")
    # fp32 AdamW: two states per parameter element of this rank's partitions (stage 1: of the whole buffer).
    expect(moved["parameters"] > 0 and moved["optimizer_states"] > 0 and moved["gradients"] > 0, f"stage {stage}: moved {moved}")
    check.expect_error(tessera.Error, ["offload_states", "reload_states()"], engine.step)
    back = engine.reload_states()
    expect(back == moved, f"stage {stage}: reload moved {back}, offload {moved}")
    for step in range(STEPS, 2 * STEPS):
        engine.backward(loss_of(engine, step, rank))
        engine.step()
    with engine.gathered_parameters():
        got = [p.detach().clone() for p in model.parameters()]
    expect(all(torch.equal(a, b) for a, b in zip(got, want)), f"stage {stage}: the weights differ from the oracle's")
    # Only the optimizer's states: the weights keep their memory.
    before = storage_bytes(model)
    part = engine.offload_states(include=["optim_states"])
    expect(part["optimizer_states"] > 0 and part["parameters"] == 0 and storage_bytes(model) == before,
           f"stage {stage}: include=['optim_states'] moved {part}")
    engine.reload_states()
    check.expect_error(tessera.ConfigError, ["unknown state", "lp_paramz"], lambda: engine.offload_states(include=["lp_paramz"]))
    engine.destroy()
check.finish("offload states ok")
