#!/usr/bin/env python3
"""Bad input from Python raises tessera's exception classes with the C++ API's messages, and the interpreter lives
on: a loss that is not a scalar, not a tensor (a module whose forward returns none, at stages 1 and 3) or an
integer, a parameter of the wrong dtype, a frozen parameter or a non-parameter tensor in model_parameters, and step() on rank 0 alone (a 2 s collective timeout in the config: rank 0's TimeoutError names the operation and
the rank that did not arrive). 2 ranks under tools/tessera-launch."""
import sys
import time

import torch

import tessera

rank = tessera.comm.get_rank()
failures = []


def expect_error(cls, words, call):
    try:
        call()
    except cls as e:
        if not all(w in str(e) for w in words):
            failures.append(f"{cls.__name__} without {words}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"expected {cls.__name__} with {words}, got {type(e).__name__}: {e}")
        return
    failures.append(f"expected {cls.__name__} with {words}: nothing raised")


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 1}, "tessera": {"transport": {"collective_timeout_ms": 2000}}}

m = model_of()
expect_error(tessera.ConfigError, ["not a parameter"],
             lambda: tessera.initialize(model=m, model_parameters=[m[0].weight * 2], config=config))
m = model_of()
m[0].bias.requires_grad_(False)
expect_error(tessera.ConfigError, ["0.bias"], lambda: tessera.initialize(model=m, model_parameters=m.parameters(), config=config))
expect_error(tessera.ConfigError, ["unknown key"], lambda: tessera.initialize(model=model_of(), config=dict(config, zero_optimisation={})))
# A parameter of the wrong dtype is refused by name, before anything is built.
expect_error(tessera.Error, ["'0.weight' is Double", "fp32"], lambda: tessera.initialize(model=model_of().double(), config=config))


class NoTensor(torch.nn.Module):
    """A module whose forward returns no tensor."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 2)

    def forward(self, x):
        self.proj(x)
        return {"rows": x.shape[0]}


for stage in (1, 3):  # at stage 3 the unit's hooks see outputs that hold no tensor
    no_tensor, _, _, _ = tessera.initialize(model=NoTensor(), config=dict(config, zero_optimization={"stage": stage}))
    expect_error(tessera.Error, ["must be a tensor, not dict"], lambda: no_tensor.backward(no_tensor(torch.randn(4, 8))))
    no_tensor.destroy()

model = model_of()
engine, _, _, _ = tessera.initialize(model=model, config=config)
expect_error(tessera.Error, ["does not require grad"], lambda: engine.backward(torch.tensor(3)))  # an integer loss
expect_error(tessera.Error, ["scalar"], lambda: engine.backward(torch.ones(2, requires_grad=True).sum(0, keepdim=True).expand(2)))
expect_error(tessera.Error, ["must be a tensor"], lambda: engine.backward(None))
engine.backward(engine(torch.randn(4, 8)).pow(2).mean())
if rank == 0:
    expect_error(tessera.TimeoutError, ["did not complete within 2000 ms", "rank 1"], engine.step)
else:
    time.sleep(6)  # never steps: rank 0 waits for it in vain

if failures:
    for f in failures:
        print(f"rank {rank}: FAILED: {f}", flush=True)
    sys.exit(1)
print(f"rank {rank}: python bad input ok", flush=True)
