#!/usr/bin/env python3
"""DeepSpeed engine calls from Python beyond backward/step, 2 ranks, against the single-process PyTorch oracle:
  scale(loss).backward() then step() (a script's own backward) at stages 1 and 3: the oracle's weights bit for bit;
  coalesce_grad_reduction() around two backward() per step at stages 1 and 2: the weights of an oracle that
  accumulates both micro-batches' gradients on each rank, then averages the ranks;
  storage_maps() at stage 2: every piece of this rank's "master" maps, read from its buffer through the piece's
  offset and strides, equals the oracle's weights, and the ranks' pieces cover each parameter exactly once.
Negative control: an oracle with one micro-batch fewer differs. Usage: tessera-launch --nproc-per-node 2 python3 ..."""
import torch

import tessera
from checks import Checks
from mlp_task import model_of, rows
from pytorch_oracle import train_averaged

STEPS, MICRO, LR = 6, 4, 2e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect
mse = torch.nn.functional.mse_loss


def loss_of(model, step, r, part=0):
    x, y = rows(2 * step + part, r, MICRO)
    return mse(model(x), y)


def config(stage):
    return {"train_micro_batch_size_per_gpu": MICRO, "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 0},
            "tessera": {"transport": {"collective_timeout_ms": 30000}}}


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def coalesced_oracle(parts=2):
    """Each rank's micro-batches differentiated one after the other into .grad, the ranks averaged, AdamW."""
    model = model_of()
    return train_averaged(model, adamw(model), loss_of, STEPS, world, micro_batches=parts)


def weights(engine, model):
    with engine.gathered_parameters():
        return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


model = model_of()
plain = train_averaged(model, adamw(model), loss_of, STEPS, world)
for stage in (1, 3):
    model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, config=config(stage))
    for step in range(STEPS):
        engine.scale(loss_of(engine, step, rank)).backward()
        engine.step()
    expect(same(weights(engine, model), plain), f"scale(loss).backward() at stage {stage} differs from the oracle")

coalesced = coalesced_oracle()
expect(not same(coalesced_oracle(parts=1), coalesced), "negative control: one micro-batch fewer gives the same weights")
for stage in (1, 2):
    model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, config=config(stage))
    for step in range(STEPS):
        with engine.coalesce_grad_reduction():
            for part in range(2):
                engine.backward(loss_of(engine, step, rank, part))
        engine.step()
    expect(same(weights(engine, model), coalesced), f"coalesce_grad_reduction at stage {stage} differs from the oracle")
    if stage == 2:
        storage = engine.storage_maps()
        expected = dict(zip([n for n, _ in model.named_parameters()], coalesced))
        covered = torch.zeros(len(expected), dtype=torch.long)
        for i, (name, value) in enumerate(expected.items()):
            (stored,) = [m for m in storage.maps if m.kind == "master" and m.map["name"] == name]
            for entry in stored.map["ranks"]:
                if entry["rank"] != rank:
                    continue
                buffer = storage.buffers[stored.buffer]
                for piece in entry["pieces"]:
                    # as_strided's offset is the storage's: the buffer may be a view into a larger one.
                    got = buffer.as_strided(piece["shape"], piece["strides"], buffer.storage_offset() + piece["offset"])
                    want = value[tuple(slice(o, o + s) for o, s in zip(piece["origin"], piece["shape"]))]
                    expect(torch.equal(got, want), f"storage_maps: a piece of '{name}' differs from the oracle")
                    covered[i] += got.numel()
        tessera.comm.all_reduce(covered)
        expect(covered.tolist() == [v.numel() for v in expected.values()],
               f"storage_maps: the ranks' master pieces cover {covered.tolist()} elements")
check.finish("engine calls ok")
