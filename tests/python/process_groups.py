#!/usr/bin/env python3
"""Process groups from Python, 4 ranks: tessera.comm.new_group (every rank calls it, torch.distributed's rule) and
tessera.initialize(mpu=) with two data-parallel groups, [0, 2] and [3, 1] (a group rank order that is not the
launched one). Each group's collectives (all_reduce sum / max, all_gather_into_tensor in group-rank order, broadcast
from a launched src, barrier) against values computed here from every member's inputs; get_rank / get_world_size /
get_global_rank / get_process_group_ranks. Each group trains its own engine on its own members' data, at stages 1
and 3 (zero.Init cut for the group at stage 3), 8 steps: its weights equal the PyTorch oracle's on that group's data
(gradients averaged over the group's 2 members) bit for bit; negative control: the other group's oracle differs. The
world's collectives still span all 4 ranks beside the engines. Bad input (a collective on a group this rank is not a
member of, src outside the group, model-parallel mpu, a non-group from mpu, a rank out of range) raises
tessera.ConfigError naming it; the config's 2 s collective timeout holds for an engine on a group made with 60 s (a
step on one member alone raises tessera.TimeoutError naming the other). Usage: tessera-launch --nproc-per-node 4 /usr/bin/python3 process_groups.py"""

import datetime
import time

import torch

import tessera
from checks import Checks
from mlp_task import NAMES, model_of, mse_loss
from pytorch_oracle import train_averaged

STEPS, ROWS, LR = 8, 4, 1e-2
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect, expect_error = check.expect, check.expect_error
assert world == 4, "process_groups.py runs on 4 ranks"

MEMBERS = ([0, 2], [3, 1])
groups = [tessera.comm.new_group(MEMBERS[0]), tessera.comm.new_group(MEMBERS[1], timeout=datetime.timedelta(seconds=60))]
mine = 0 if rank in MEMBERS[0] else 1
group, other = groups[mine], groups[1 - mine]
members = MEMBERS[mine]


def value(r):
    return torch.arange(5, dtype=torch.float32) * (r + 1) - 0.5 * r


# Queries.
expect(tessera.comm.get_rank(group) == members.index(rank), f"get_rank(group) {tessera.comm.get_rank(group)}")
expect(tessera.comm.get_rank(other) == -1, "get_rank of a group this rank is not in is -1")
expect(tessera.comm.get_world_size(group) == 2 and tessera.comm.get_world_size() == 4, "get_world_size")
expect(tessera.comm.get_global_rank(group, 0) == members[0], "get_global_rank")
expect(tessera.comm.get_process_group_ranks(other) == MEMBERS[1 - mine], "get_process_group_ranks")

# Collectives on this rank's group, against values worked out here.
t = value(rank)
tessera.comm.all_reduce(t, group=group)
expect(torch.equal(t, value(members[0]) + value(members[1])), f"all_reduce sum on {group}: {t}")
t = value(rank)
tessera.comm.all_reduce(t, op="max", group=group)
expect(torch.equal(t, torch.maximum(value(members[0]), value(members[1]))), "all_reduce max on the group")
out = torch.full((2, 5), float("nan"))
tessera.comm.all_gather_into_tensor(out, value(rank), group=group)
expect(torch.equal(out, torch.stack([value(r) for r in members])), f"all_gather_into_tensor in group-rank order: {out}")
t = value(rank)
tessera.comm.broadcast(t, src=members[1], group=group)  # src is a launched rank
expect(torch.equal(t, value(members[1])), f"broadcast from launched rank {members[1]}: {t}")
tessera.comm.barrier(group=group)
# The world still spans every rank.
t = value(rank)
tessera.comm.all_reduce(t)
expect(torch.equal(t, value(0) + value(1) + value(2) + value(3)), f"world all_reduce: {t}")


class Mpu:
    """DeepSpeed's mpu interface: data parallel over this rank's group, no model parallelism."""

    def __init__(self, dp, mp=1):
        self.dp, self.mp = dp, mp

    def get_data_parallel_group(self):
        return self.dp

    def get_model_parallel_world_size(self):
        return self.mp


def loss_for(data_members):
    """The loss of group rank r on a group of data_members: launched rank data_members[r]'s rows."""
    return lambda model, step, group_rank: mse_loss(model, step, data_members[group_rank], ROWS)


def train(stage):
    config = {"train_micro_batch_size_per_gpu": ROWS, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "tessera": {"transport": {"collective_timeout_ms": 30000}}}
    if stage == 3:
        with tessera.zero.Init(mpu=Mpu(group)):
            model = model_of()
    else:
        model = model_of()
    engine, *_ = tessera.initialize(model=model, config=config, mpu=Mpu(group))
    expect(engine.data_parallel_group is group, "engine.data_parallel_group is mpu's")
    for step in range(STEPS):
        loss = loss_for(members)(engine, step, tessera.comm.get_rank(group))
        engine.backward(loss)
        engine.step()
        if step == 3:  # the world's collectives between the group's steps
            t = value(rank)
            tessera.comm.all_reduce(t)
            expect(torch.equal(t, value(0) + value(1) + value(2) + value(3)), f"world all_reduce between steps: {t}")
    with engine.gathered_parameters():
        weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.destroy()
    return [weights[n] for n in NAMES]


def oracle(data_members):
    model = model_of()
    return train_averaged(model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0), loss_for(data_members),
                          STEPS, 2)


expected, others = oracle(members), oracle(MEMBERS[1 - mine])
for stage in (1, 3):
    got = train(stage)
    for name, g, e, o in zip(NAMES, got, expected, others):
        expect(torch.equal(g, e), f"stage {stage}: {name} differs from the oracle on group {members}'s data "
                                  f"(max {(g - e).abs().max().item():.3g})")
    expect(any(not torch.equal(g, o) for g, o in zip(got, others)),
           f"stage {stage}: negative control: the other group's oracle equals this group's weights")

# Bad input, each raising tessera.ConfigError naming what is wrong.
expect_error(tessera.ConfigError, [f"rank {rank} is not a member", str(MEMBERS[1 - mine])],
             lambda: tessera.comm.all_reduce(value(rank), group=other))
expect_error(tessera.ConfigError, ["src", "not a member"],
             lambda: tessera.comm.broadcast(value(rank), src=MEMBERS[1 - mine][0], group=group))
expect_error(tessera.ConfigError, ["get_model_parallel_world_size() is 2", "not implemented"],
             lambda: tessera.initialize(model=model_of(), config={"train_micro_batch_size_per_gpu": 1}, mpu=Mpu(group, 2)))
expect_error(tessera.ConfigError, ["must be a tessera.comm.ProcessGroup", "object"],
             lambda: tessera.initialize(model=model_of(), config={"train_micro_batch_size_per_gpu": 1}, mpu=Mpu(object())))
expect_error(tessera.ConfigError, [f"rank {rank} is not a member of the data-parallel group"],
             lambda: tessera.initialize(model=model_of(), config={"train_micro_batch_size_per_gpu": 1}, mpu=Mpu(other)))
expect_error(tessera.ConfigError, ["rank 4 is not a launched rank 0..3"], lambda: tessera.comm.new_group([0, 4]))
expect_error(tessera.ConfigError, ["must be a tessera.comm.ProcessGroup"],
             lambda: tessera.comm.all_reduce(value(rank), group=object()))
# The config's collective timeout holds for an engine on a given group (made with a longer one): step() on group
# rank 0 alone fails there within 2 s, naming the operation and the member that did not arrive.
model = model_of()
engine, *_ = tessera.initialize(model=model, mpu=Mpu(group), config={
    "train_micro_batch_size_per_gpu": ROWS, "optimizer": {"type": "SGD", "params": {"lr": LR}},
    "zero_optimization": {"stage": 1}, "tessera": {"transport": {"collective_timeout_ms": 2000}}})
engine.backward(loss_for(members)(engine, 0, tessera.comm.get_rank(group)))
if tessera.comm.get_rank(group) == 0:
    start = time.monotonic()
    expect_error(tessera.TimeoutError, ["did not complete within 2000 ms", f"rank {members[1]}"], engine.step)
    expect(time.monotonic() - start < 10, f"the step's timeout took {time.monotonic() - start:.1f} s, not the config's 2 s")
else:
    time.sleep(6)  # never steps: its group's rank 0 waits for it in vain
tessera.comm.barrier()  # the world's communicator is the engines' neither
check.finish("process groups ok")
