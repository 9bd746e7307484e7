#!/usr/bin/env python3
"""A client torch.optim optimizer passed to tessera.initialize from Python (DeepSpeed's `optimizer=`), against a
single-process PyTorch oracle running the same optimizer class, bit for bit after 12 steps on 2 ranks:
  translated to the flat optimizers: AdamW with two groups (their own weight decay and lr) at stages 0-3, Adam with
  amsgrad, SGD with Nesterov momentum, Adagrad with lr decay;
  run by its own step() on the flat partitions: RMSprop (no flat equivalent) at stages 1 and 3, and a user's
  subclass of AdamW (a subclass may change step(), so it is not translated);
  DeepSpeed's optimizer factory (a callable given model_parameters).
Negative control: an oracle with a perturbed lr differs. Bad input: maximize=True, an optimizer section in the config
as well, an optimizer that already holds state, a step() that raises: tessera.ConfigError / tessera.Error naming it.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 client_optimizer.py"""

import torch

import tessera
from checks import Checks
from pytorch_oracle import train_averaged

STEPS, BATCH = 12, 8
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect, expect_error = check.expect, check.expect_error


def model_of():
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4))


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    x, y = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)
    return torch.nn.functional.mse_loss(model(x), y)


class ScaledAdamW(torch.optim.AdamW):
    """A user's subclass: tessera cannot know what it changed, so its own step() runs."""


def two_groups(model, **extra):
    return [{"params": [model[0].weight, model[2].weight], "weight_decay": 0.05, "name": "decay"},
            {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0, "lr": 2e-3, **extra}]


CASES = {  # name -> (builds the optimizer on a model, stages)
    "AdamW two groups": (lambda m: torch.optim.AdamW(two_groups(m), lr=4e-3), (0, 1, 2, 3)),
    "Adam amsgrad": (lambda m: torch.optim.Adam(m.parameters(), lr=3e-3, amsgrad=True, weight_decay=0.01), (1, 3)),
    "SGD nesterov": (lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                               weight_decay=1e-3), (2,)),
    "Adagrad": (lambda m: torch.optim.Adagrad(m.parameters(), lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1),
                (1,)),
    "RMSprop (own step)": (lambda m: torch.optim.RMSprop(m.parameters(), lr=2e-3, momentum=0.5, centered=True),
                           (1, 3)),
    "AdamW subclass (own step)": (lambda m: ScaledAdamW(two_groups(m), lr=4e-3), (2,)),
}


def config(stage, **extra):
    return {"train_micro_batch_size_per_gpu": BATCH, "zero_optimization": {"stage": stage, "reduce_bucket_size": 500,
            "stage3_param_persistence_threshold": 10}, "tessera": {"transport": {"collective_timeout_ms": 30000}}, **extra}


def oracle(build, lr_scale=1.0):
    model = model_of()
    optimizer = build(model)
    for group in optimizer.param_groups:
        group["lr"] *= lr_scale
    return train_averaged(model, optimizer, loss_of, STEPS, world)


def trained(model, engine):
    for step in range(STEPS):
        engine.backward(loss_of(engine, step, rank))
        engine.step()
    with engine.gathered_parameters():
        return [p.detach().clone() for p in model.parameters()]


def same(got, expected):
    return all(torch.equal(g, e) for g, e in zip(got, expected))


for name, (build, stages) in CASES.items():
    expected = oracle(build)
    for stage in stages:
        model = model_of()
        engine, optimizer, _, _ = tessera.initialize(model=model, optimizer=build(model), config=config(stage))
        got = trained(model, engine)
        diffs = [(g - e).abs().max().item() for g, e in zip(got, expected)]
        expect(same(got, expected), f"{name}, stage {stage}: differs from the oracle by {diffs}")
        expect(len(optimizer.param_groups) == len(engine.client_optimizer.param_groups),
               f"{name}: {len(optimizer.param_groups)} engine groups")

# DeepSpeed's factory: optimizer=callable(model_parameters).
expected = oracle(lambda m: torch.optim.SGD(m.parameters(), lr=0.03))
model = model_of()
engine, _, _, _ = tessera.initialize(model=model, model_parameters=model.parameters(),
                                     optimizer=lambda params: torch.optim.SGD(params, lr=0.03), config=config(1))
expect(same(trained(model, engine), expected), "an optimizer factory: differs from the oracle")

# Negative control: the oracle with another lr does not match.
expect(not same(oracle(CASES["RMSprop (own step)"][0], 1.0001), oracle(CASES["RMSprop (own step)"][0])),
       "a perturbed oracle equals the oracle")


m = model_of()
expect_error(tessera.ConfigError, ["maximize"],
             lambda: tessera.initialize(model=m, optimizer=torch.optim.Adam(m.parameters(), maximize=True), config=config(1)))
m = model_of()
expect_error(tessera.ConfigError, ["client optimizer", "optimizer"],
             lambda: tessera.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                                        config=config(1, optimizer={"type": "AdamW", "params": {"lr": 1e-3}})))
m = model_of()
used = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
m(torch.randn(2, 16)).sum().backward()
used.step()
expect_error(tessera.ConfigError, ["already holds state"], lambda: tessera.initialize(model=m, optimizer=used, config=config(1)))


class Broken(torch.optim.SGD):
    def step(self, closure=None):
        raise ValueError("this optimizer is broken")


m = model_of()
engine, _, _, _ = tessera.initialize(model=m, optimizer=Broken(m.parameters(), lr=0.1), config=config(1))
engine.backward(loss_of(engine, 0, rank))
expect_error(tessera.Error, ["step() raised", "this optimizer is broken"], engine.step)

check.finish(f"client optimizer ok ({len(CASES)} classes, bitwise equal to the PyTorch oracle)")
