#!/usr/bin/env python3
"""tessera.zero.Init (DeepSpeed's partitioned construction) and tessera.zero.GatheredParameters from Python, 2 ranks:
a model built inside Init holds no parameter memory afterwards (each rank keeps its chunk in the engine's
construction table), including a subclass that scales its weight in its own __init__ after super().__init__ and a
class defined inside the scope; a stage-3 engine built from it trains 10 steps to the weights of the PyTorch oracle
(the same model built plainly from the same seed, gradients averaged, torch.optim.AdamW) bit for bit. The scope
restores every class on exit; a stage-2 config refuses a cut model by name; GatheredParameters writes rank 0's
change back and refuses cut parameters before initialize. Negative control: a perturbed oracle differs.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 zero_init.py"""

import torch

import tessera
from checks import Checks
from pytorch_oracle import train_averaged

STEPS, BATCH, LR = 10, 4, 2e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


class ScaledLinear(torch.nn.Linear):
    """Changes its weight after super().__init__: Init must cut only when this __init__ has returned."""

    def __init__(self, a, b):
        super().__init__(a, b)
        with torch.no_grad():
            self.weight.mul_(0.5)


def build():
    class Block(torch.nn.Module):  # defined (again) at each call: inside the scope when built under Init
        def __init__(self):
            super().__init__()
            self.up, self.down = ScaledLinear(12, 30), torch.nn.Linear(30, 12)
            self.norm = torch.nn.LayerNorm(12)

        def forward(self, x):
            return self.norm(x + self.down(torch.relu(self.up(x))))

    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), Block(), Block(), torch.nn.Linear(12, 3))


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(50 * step + r)
    return torch.nn.functional.mse_loss(model(torch.randn(BATCH, 6, generator=g)), torch.randn(BATCH, 3, generator=g))


def oracle(lr=LR):
    model = build()
    return train_averaged(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), loss_of, STEPS, world)


config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "tessera": {"transport": {"collective_timeout_ms": 30000}}}
linear_init = torch.nn.Linear.__init__
with tessera.zero.Init():
    model = build()
expect(torch.nn.Linear.__init__ is linear_init and "__init_subclass__" not in torch.nn.Module.__dict__,
       "Init did not restore the classes")
expect(all(p.storage().data_ptr() == 0 and tessera._tessera.is_partitioned(p) for p in model.parameters()),
       "a parameter built under Init kept its memory")
expect(torch.nn.Linear(3, 3).weight.storage().data_ptr() != 0, "a module built after the scope was cut")
try:
    with tessera.zero.GatheredParameters(model[0].weight):
        pass
    expect(False, "GatheredParameters on cut parameters without an engine")
except tessera.ConfigError as e:
    expect("zero.Init" in str(e), f"GatheredParameters before initialize: {e}")
engine, _, _, _ = tessera.initialize(model=model, config=config)
for step in range(STEPS):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
with tessera.zero.GatheredParameters(list(model.parameters())):
    got = [p.detach().clone() for p in model.parameters()]
expected = oracle()
for i, (g, e) in enumerate(zip(got, expected)):
    expect(torch.equal(g, e), f"parameter {i} differs from the oracle by {(g - e).abs().max().item()}")
expect(not all(torch.equal(a, b) for a, b in zip(oracle(LR * 1.001), expected)), "negative control: the oracle moved not")
with tessera.zero.GatheredParameters(model[3].bias, modifier_rank=0):
    if rank == 0:
        with torch.no_grad():
            model[3].bias.fill_(0.25)
with tessera.zero.GatheredParameters(model[3].bias):
    expect(bool((model[3].bias == 0.25).all()), "GatheredParameters(modifier_rank=0) did not write back")

with tessera.zero.Init():
    cut = build()
try:
    tessera.initialize(model=cut, config=dict(config, zero_optimization={"stage": 2}))
    expect(False, "a stage-2 engine took a model cut by zero.Init")
except tessera.ConfigError as e:
    expect("partitioned construction" in str(e), f"stage 2: {e}")
check.finish("zero init ok")
