#!/usr/bin/env python3
"""ZeRO-3 leaf modules from Python (tessera.utils.set_z3_leaf_modules, DeepSpeed's call): a block that calls its
experts in a different order on each rank trains at stage 3 on 2 ranks to the same weights, bit for bit, as a
single-process PyTorch oracle that differentiates each rank's loss (in that rank's order), averages the gradients
and steps torch.optim.AdamW. The block is one unit (its experts are not), marked by class, by name, by suffix, by
DeepSpeed's default class names, or by the config's leaf_module.classes (matched against Python class names); a name
the model lacks is refused; a perturbed oracle differs, and unmarked the ranks get the order check's error, not an
abort (negative controls).
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 z3_leaf.py"""
import sys

import torch

import tessera
from pytorch_oracle import train_averaged

STEPS, BATCH, LR = 8, 4, 1e-2
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
failures = []
order_of_rank = {"rank": rank}  # which rank's expert order the block uses (the oracle plays every rank)


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {rank}: FAILED: {what}", flush=True)


class Experts(torch.nn.Module):
    """Four experts of different widths, called in rank order on even ranks and reversed on odd ones."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(16, 16 + 4 * i) for i in range(4)])

    def forward(self, x):
        order = list(range(4)) if order_of_rank["rank"] % 2 == 0 else list(reversed(range(4)))
        out = torch.zeros_like(x)
        for i in order:
            out = out + self.experts[i](x)[:, :16]
        return out


class MixtralSparseMoeBlock(Experts):  # named as DeepSpeed's default leaf class: a leaf without marking
    pass


def model_of(block=Experts):
    torch.manual_seed(77)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), block(), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)
    order_of_rank["rank"] = r
    return torch.nn.functional.mse_loss(model(x), y)


def oracle(lr=LR):
    model = model_of()
    return train_averaged(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), loss_of, STEPS, world)


config = {"train_micro_batch_size_per_gpu": BATCH,
          "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "tessera": {"transport": {"collective_timeout_ms": 60000}}}

# Marking, without an engine.
utils = tessera.utils
m = model_of()
expect([id(x) for x in utils.set_z3_leaf_modules(m, [Experts])] == [id(m[1])], "by class: only the block is marked")
expect(utils.z3_leaf_module(m[1]) and not utils.z3_leaf_module(m[1].experts[0]), "by class: the mark")
expect(utils.unset_z3_leaf_modules(m, [Experts]) and not utils.get_z3_leaf_modules(m), "unset removes the mark")
expect(len(utils.set_z3_leaf_modules(m, ["Experts"])) == 1, "by class name")
utils.unset_z3_leaf_modules(m, [Experts])
expect([id(x) for x in utils.set_z3_leaf_modules_by_suffix(m, ["experts"])] == [id(m[1].experts)], "by suffix")
utils.unset_z3_leaf_modules(m, [torch.nn.ModuleList])
try:
    utils.set_z3_leaf_modules_by_name(m, ["1", "9.mlp"])
    expect(False, "a missing module name was accepted")
except tessera.ConfigError as e:
    expect("9.mlp" in str(e) and not utils.get_z3_leaf_modules(m), f"missing name: {e} (nothing marked)")

expected = oracle()
perturbed = oracle(lr=LR * 1.01)
expect(any(not torch.equal(a, b) for a, b in zip(expected, perturbed)), "negative control: a perturbed oracle is equal")

for how in ("class", "name", "default class", "config class"):
    model = model_of(MixtralSparseMoeBlock if how == "default class" else Experts)
    if how == "class":
        tessera.utils.set_z3_leaf_modules(model, [Experts])
    elif how == "name":
        tessera.utils.set_z3_leaf_modules_by_name(model, ["1"])
    leaf_config = dict(config, zero_optimization=dict(config["zero_optimization"], leaf_module={"classes": ["Experts"]}))
    engine, _, _, _ = tessera.initialize(model=model, model_parameters=model.parameters(),
                                         config=leaf_config if how == "config class" else config)
    units = engine._engine.unit_prefixes()
    expect("1" in units and not any(u.startswith("1.") for u in units), f"{how}: units {units}: the block is one unit")
    for step in range(STEPS):
        loss = loss_of(engine, step, rank)
        engine.backward(loss)
        engine.step()
    with engine.gathered_parameters():
        got = [p.detach().clone() for p in model.parameters()]
    for i, (g, e) in enumerate(zip(got, expected)):
        expect(torch.equal(g, e), f"{how}: parameter {i} differs from the oracle by {(g - e).abs().max().item()}")
    del engine

# Negative control, last (the engine cannot go on after it): unmarked, the experts are units of their own and the
# ranks gather different ones; every rank gets the order check's error (naming the leaf-module remedy), none
# aborts (the gathers' data never moves when the headers differ).
model = model_of()
engine, _, _, _ = tessera.initialize(model=model, model_parameters=model.parameters(), config=config)
try:
    engine.backward(loss_of(engine, 0, rank))
    expect(False, "unmarked: the ranks gathered different experts without an error")
except tessera.Error as e:
    expect("gather different units" in str(e) and "leaf module" in str(e), f"unmarked: {e}")

if failures:
    sys.exit(1)
print(f"rank {rank}: z3 leaf ok (a block with rank-dependent expert order, stage 3, bitwise equal to the oracle)",
      flush=True)
