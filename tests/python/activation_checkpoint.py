#!/usr/bin/env python3
"""Activation checkpointing from Python (torch.utils.checkpoint, reentrant and not) on tessera at ZeRO stages 0-3,
2 ranks: the blocks run without keeping their activations and are run again in backward (at stage 3 their units
are gathered again for that recomputation, through the same forward hooks), and after 12 AdamW steps the weights
equal, bit for bit, a single-process PyTorch oracle's that trains the same model *without* checkpointing
(checkpointing must not change a single bit). Also checked: each checkpointed block really ran twice per step, at
stage 3 its weights hold no memory after the step (released after the recomputation too), and a perturbed oracle
differs (negative control).
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 activation_checkpoint.py"""
import torch
import torch.utils.checkpoint

import tessera
from checks import Checks
from pytorch_oracle import train_averaged

STEPS, BATCH, LR = 12, 6, 2e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
checks = Checks(f"rank {rank}")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(24, 48), torch.nn.Linear(48, 24)
        self.calls = 0

    def forward(self, h):
        self.calls += 1
        return h + self.down(torch.relu(self.up(h)))


class Net(torch.nn.Module):
    """embed -> 3 residual blocks -> head; `mode` None runs the blocks plainly, else torch.utils.checkpoint with
    use_reentrant = (mode == "reentrant")."""

    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(4321)
        self.embed = torch.nn.Linear(16, 24)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(24, 4)
        self.mode = mode

    def forward(self, x):
        h = self.embed(x)  # requires grad, so a reentrant checkpoint's input does too
        for block in self.blocks:
            if self.mode is None:
                h = block(h)
            else:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=self.mode == "reentrant")
        return self.head(h)


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(500 * step + r)
    x, y = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)
    return torch.nn.functional.mse_loss(model(x), y)


def oracle(lr=LR):
    model = Net(None)
    return train_averaged(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01), loss_of, STEPS, world)


def config(stage):
    return {"train_micro_batch_size_per_gpu": BATCH,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 1500, "stage3_param_persistence_threshold": 0},
            "tessera": {"transport": {"collective_timeout_ms": 60000}}}


expected = oracle()
perturbed = oracle(LR * (1 + 1e-6))
checks.expect(any(not torch.equal(a, b) for a, b in zip(expected, perturbed)), "negative control: a perturbed oracle equals")
for mode in ("reentrant", "non_reentrant"):
    for stage in (0, 1, 2, 3):
        what = f"{mode}, stage {stage}"
        print(f"rank {rank}: {what}", flush=True)
        model = Net(mode)
        engine, _, _, _ = tessera.initialize(model=model, config=config(stage))
        for step in range(STEPS):
            before = [b.calls for b in model.blocks]
            engine.backward(loss_of(engine, step, rank))
            engine.step()
            ran = [b.calls - c for b, c in zip(model.blocks, before)]
            checks.expect(ran == [2, 2, 2], f"{what}, step {step}: the blocks ran {ran} times, not twice (forward, recompute)")
        if stage == 3:
            held = [n for n, p in model.named_parameters() if p.storage().data_ptr() != 0]
            checks.expect(not held, f"{what}: parameters still hold memory after the step: {held}")
        with engine.gathered_parameters():
            got = [p.detach().clone() for p in model.parameters()]
        for (name, _), g, e in zip(model.named_parameters(), got, expected):
            checks.expect(torch.equal(g, e), f"{what}: '{name}' differs from the oracle by {(g - e).abs().max().item()}")
        engine.destroy()
checks.finish("activation checkpoint ok")
