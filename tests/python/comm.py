#!/usr/bin/env python3
"""tessera.comm's collectives on 2 ranks against values computed here from every rank's inputs (each rank knows
what the others hold): all_reduce sum / avg / max (in place, a 2-d tensor), all_gather and all_gather_into_tensor
(rank order), broadcast from rank 1, barrier; the engine still trains beside them; bad input (a group that is no tessera.comm.ProcessGroup,
async_op, an unknown op) raises tessera.ConfigError. Usage: tessera-launch --nproc-per-node 2 python3 comm.py"""

import torch

import tessera
from checks import Checks

rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


def mine(r):
    return torch.arange(6, dtype=torch.float32).view(2, 3) * (r + 1) + 0.25 * r


everyone = [mine(r) for r in range(world)]
for op, expected in (("sum", sum(everyone)), (tessera.comm.ReduceOp.AVG, sum(everyone) / world),
                     ("max", torch.stack(everyone).max(0).values)):
    t = mine(rank)
    tessera.comm.all_reduce(t, op=op)
    expect(torch.equal(t, expected), f"all_reduce {op}: {t} != {expected}")
out = torch.full((world, 2, 3), float("nan"))
tessera.comm.all_gather_into_tensor(out, mine(rank))
expect(torch.equal(out, torch.stack(everyone)), "all_gather_into_tensor: not every rank's tensor in rank order")
parts = [torch.full((2, 3), float("nan")) for _ in range(world)]
tessera.comm.all_gather(parts, mine(rank))
expect(all(torch.equal(p, e) for p, e in zip(parts, everyone)), "all_gather: wrong parts")
t = mine(rank)
tessera.comm.broadcast(t, src=1)
expect(torch.equal(t, everyone[1]), "broadcast from rank 1")
tessera.comm.barrier()
# An engine made after the communicator, and collectives between its steps.
model = torch.nn.Linear(3, 1)
engine, _, _, _ = tessera.initialize(model=model, config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
                                                          "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
loss = engine(torch.ones(2, 3) * rank).pow(2).mean()
engine.backward(loss)
engine.step()
total = loss.detach().clone()
tessera.comm.all_reduce(total)
expect(total.item() > 0, "all_reduce after a step")
for call, words in ((lambda: tessera.comm.all_reduce(mine(rank), group=object()), "tessera.comm.ProcessGroup"),
                    (lambda: tessera.comm.all_reduce(mine(rank), async_op=True), "async_op"),
                    (lambda: tessera.comm.all_reduce(mine(rank), op="min"), "not one of")):
    try:
        call()
        expect(False, f"{words}: nothing raised")
    except tessera.ConfigError as e:
        expect(words in str(e), f"{words}: {e}")
check.finish("comm ok")
