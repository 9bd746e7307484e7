#!/usr/bin/env python3
"""What a receiver that is not tessera's (a vLLM- or SGLang-style engine, verl's per-tensor export) reads from the
engine from Python, at 2 ranks and ZeRO stages 0-3 after 6 steps of AdamW:
  weight_metadata(): (name, dtype, full shape) of every trainable weight, equal to the model's own before
  initialize (the oracle), the frozen one left out, bf16 under bf16 training; at ZeRO-3 nothing is gathered for it;
  named_weights(): every trainable weight whole, bitwise equal to the single-process PyTorch oracle's; at ZeRO-3
  one unit at a time (while one is yielded, the other units hold no memory) and released after.
Negative control: a weight of the oracle perturbed by one ulp is noticed.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 weight_export.py"""

import torch

import tessera
from checks import Checks
from pytorch_oracle import train_averaged

STEPS, BATCH, LR = 6, 4, 2e-3
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
check = Checks(f"rank {rank}")
expect = check.expect


def model_of():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 24), torch.nn.Linear(24, 40), torch.nn.GELU(),
                                torch.nn.Linear(40, 24), torch.nn.LayerNorm(24))
    model[0].weight.requires_grad_(False)  # frozen: not the engine's, not exported
    return model


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    tokens = torch.randint(0, 50, (BATCH, 5), generator=g)
    return model(tokens).pow(2).mean()


def config(stage, bf16=False):
    return {"train_micro_batch_size_per_gpu": BATCH, "bf16": {"enabled": bf16},
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 30},
            "tessera": {"transport": {"collective_timeout_ms": 30000}}}


fresh = model_of()
trainable = [(n, p) for n, p in fresh.named_parameters() if p.requires_grad]
expected_meta = [(n, p.dtype, tuple(p.shape)) for n, p in trainable]
oracle_model = model_of()
oracle = dict(zip([n for n, p in oracle_model.named_parameters() if p.requires_grad],
                  train_averaged(oracle_model, torch.optim.AdamW(
                      [p for p in oracle_model.parameters() if p.requires_grad], lr=LR, weight_decay=0.01),
                      loss_of, STEPS, world)))

for stage in (0, 1, 2, 3):
    model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, config=config(stage))
    for step in range(STEPS):
        engine.backward(loss_of(engine, step, rank))
        engine.step()
    meta = engine.weight_metadata()
    expect(sorted((m.name, m.dtype, m.shape) for m in meta) == sorted(expected_meta),
           f"stage {stage}: weight_metadata {meta} != {expected_meta}")
    if stage == 3:
        expect(model[1].weight.storage().data_ptr() == 0, "stage 3: weight_metadata gathered a unit")
    seen = {}
    for name, tensor in engine.named_weights():
        seen[name] = tensor.clone()
        if stage == 3:
            others = [p for n, p in model.named_parameters() if p.requires_grad and p.numel() > 30 and
                      not name.startswith(n.rsplit(".", 1)[0] + ".")]
            expect(all(p.storage().data_ptr() == 0 for p in others), f"stage 3: more than one unit gathered at '{name}'")
    expect(sorted(seen) == sorted(oracle), f"stage {stage}: named_weights gave {sorted(seen)}")
    for name, value in oracle.items():
        got = seen.get(name)
        expect(got is not None and torch.equal(got, value),
               f"stage {stage}: '{name}' differs from the oracle" + ("" if got is None else f" by {(got - value).abs().max().item()}"))
    if stage == 3:
        expect(model[1].weight.storage().data_ptr() == 0, "stage 3: named_weights left a unit gathered")
    if stage == 1:  # negative control: one ulp in one weight is noticed by the same comparison
        name = next(iter(oracle))
        bumped = oracle[name].clone()
        bumped.view(-1)[0] = torch.nextafter(bumped.view(-1)[0], torch.tensor(float("inf")))
        expect(not torch.equal(seen[name], bumped), "the comparison missed a one-ulp change")

model = model_of()
engine, _, _, _ = tessera.initialize(model=model, config=config(2, bf16=True))
dtypes = {m.dtype for m in engine.weight_metadata()}
expect(dtypes == {torch.bfloat16}, f"bf16 training: weight_metadata dtypes {dtypes}")
expect(all(t.dtype == torch.bfloat16 for _, t in engine.named_weights()), "bf16 training: named_weights not bf16")

check.finish("weight export ok (stages 0-3, bitwise equal to the PyTorch oracle)")
