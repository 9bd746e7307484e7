#!/usr/bin/env python3
"""A script that also starts torch.distributed (Gloo, env://, before tessera) keeps working under tessera-launch:
torch's store takes MASTER_PORT, tessera's its own (TESSERA_STORE_PORT); the script's torch.distributed
all_reduce, tessera.comm's and a ZeRO-3 engine all run side by side, and the engine trains 8 steps to the PyTorch
oracle's weights bit for bit. Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 torch_distributed.py"""
import os

import torch
import torch.distributed as dist

import tessera
from checks import Checks
from pytorch_oracle import train_averaged

dist.init_process_group("gloo")  # env://: MASTER_ADDR / MASTER_PORT, as torchrun scripts do
rank, world = dist.get_rank(), dist.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


expect(int(os.environ["MASTER_PORT"]) == int(os.environ["TESSERA_STORE_PORT"]) + 1, "the launcher's ports")
expect(rank == tessera.comm.get_rank() and world == tessera.comm.get_world_size(), "ranks differ")
STEPS, BATCH, LR = 8, 4, 1e-2


def model_of():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(10 * step + r)
    return model(torch.randn(BATCH, 5, generator=g)).pow(2).mean()


model = model_of()
engine, _, _, _ = tessera.initialize(model=model, config={
    "train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
for step in range(STEPS):
    loss = loss_of(engine, step, rank)
    engine.backward(loss)
    engine.step()
    total = loss.detach().clone()
    dist.all_reduce(total)  # torch.distributed between the engine's steps
    mine = loss.detach().clone()
    tessera.comm.all_reduce(mine)
    expect(torch.equal(total, mine), f"step {step}: torch.distributed and tessera.comm sums differ")
with engine.gathered_parameters():
    got = [p.detach().clone() for p in model.parameters()]
oracle = model_of()
expected = train_averaged(oracle, torch.optim.SGD(oracle.parameters(), lr=LR, momentum=0.9), loss_of, STEPS, world)
expect(all(torch.equal(g, e) for g, e in zip(got, expected)), "the engine differs from the PyTorch oracle")
dist.barrier()
dist.destroy_process_group()
check.finish("torch.distributed ok")
