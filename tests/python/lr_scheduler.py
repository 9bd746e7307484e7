#!/usr/bin/env python3
"""A client lr scheduler from Python (DeepSpeed's lr_scheduler=), 2 ranks, against the single-process PyTorch oracle
running the same torch scheduler on the same torch optimizer, bit for bit (weights and every update's lr):
  LambdaLR built on a client AdamW with two groups (the scheduler object form);
  StepLR built by a factory on the optimizer initialize returns (the config's AdamW; the callable form);
  with 2 accumulation steps the scheduler steps once per update, not per micro-step.
Bad input: lr_scheduler= with a `scheduler` config section, an object that is not a scheduler. Negative control:
the oracle without the scheduler differs. Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 lr_scheduler.py"""
import torch

import tessera
from checks import Checks
from mlp_task import model_of, rows

STEPS, MICRO, LR = 8, 4, 4e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect, expect_error = check.expect, check.expect_error
mse = torch.nn.functional.mse_loss


def loss_of(model, micro, r):
    x, y = rows(micro, r, MICRO)
    return mse(model(x), y)


def two_groups(model):
    return torch.optim.AdamW([{"params": [model[0].weight, model[2].weight, model[4].weight], "weight_decay": 0.1},
                              {"params": [model[0].bias, model[2].bias, model[4].bias], "weight_decay": 0.0}], lr=LR)


def lambda_of(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))


def step_of(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def config_adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def oracle(make_optimizer, make_scheduler, gas=1):
    """Every rank's micro-batches, gradients averaged as a stage-1 engine does ((sum over micro-batches / gas)
    averaged over ranks), torch's optimizer and scheduler stepped once per update. Returns the weights and lrs."""
    model = model_of()
    optimizer, params = make_optimizer(model), list(model.parameters())
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    lrs = []
    for step in range(STEPS):
        sums = None
        for r in range(world):
            optimizer.zero_grad(set_to_none=True)
            for m in range(gas):
                (loss_of(model, step * gas + m, r) / gas).backward()
            grads = [p.grad.clone() for p in params]
            sums = grads if sums is None else [s.add_(g) for s, g in zip(sums, grads)]
        for p, s in zip(params, sums):
            p.grad = s.div_(world)
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        if scheduler:
            scheduler.step()
    return [p.detach().clone() for p in params], lrs


def config(gas=1, optimizer=True):
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
         "zero_optimization": {"stage": 1}, "tessera": {"transport": {"collective_timeout_ms": 30000}}}
    if optimizer:
        c["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}}
    return c


def run(make_engine, gas=1):
    model = model_of()
    engine, _, _, scheduler = make_engine(model)
    lrs = []
    for step in range(STEPS):
        lrs.append(engine.get_lr())
        for m in range(gas):
            engine.backward(loss_of(engine, step * gas + m, rank))
            engine.step()
    return [p.detach().clone() for p in model.parameters()], lrs, scheduler


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def with_object(model):
    optimizer = two_groups(model)
    return tessera.initialize(model=model, optimizer=optimizer, lr_scheduler=lambda_of(optimizer), config=config(optimizer=False))


expected, expected_lrs = oracle(two_groups, lambda_of)
got, lrs, scheduler = run(with_object)
expect(same(got, expected) and lrs == expected_lrs, f"LambdaLR on a client AdamW: lrs {lrs} vs {expected_lrs}")
expect(isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR), f"initialize returned {type(scheduler).__name__}")
for gas in (1, 2):
    expected, expected_lrs = oracle(config_adamw, step_of, gas)
    got, lrs, _ = run(lambda m: tessera.initialize(model=m, lr_scheduler=step_of, config=config(gas)), gas)
    expect(same(got, expected) and lrs == expected_lrs, f"StepLR factory, gas {gas}: lrs {lrs} vs {expected_lrs}")
expect(not same(oracle(config_adamw, None)[0], oracle(config_adamw, step_of)[0]), "negative control: no scheduler, same weights")
warm = dict(config(), scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4}})
expect_error(tessera.ConfigError, ["lr_scheduler", "scheduler"],
             lambda: tessera.initialize(model=model_of(), lr_scheduler=step_of, config=warm))
expect_error(tessera.ConfigError, ["lr_scheduler must be"],
             lambda: tessera.initialize(model=model_of(), lr_scheduler=object(), config=config()))
check.finish("lr scheduler ok")
