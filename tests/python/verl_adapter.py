#!/usr/bin/env python3
"""tessera.integrations.verl (verl's engine backend) against single-process PyTorch oracles, 2 ranks under
tools/tessera-launch, fp32. It tests the adapter against verl's BaseEngine interface as documented (verl's
verl/workers/engine/base.py and its DeepSpeed backend, read, not imported: verl is not installed and there is no
network here), not against verl itself.

Checked, with an MLP trained for 8 steps through train_batch (zero_grad, forward_backward_batch, optimizer_step):
  - weights exported by get_per_tensor_param equal the oracle's bit for bit: stages 1, 2 and 3 (oracle:
    pytorch_oracle.train_averaged, AdamW); names, dtypes and shapes equal weight_metadata();
  - with gradient_clipping, optimizer_step's norm against torch.nn.utils.clip_grad_norm_ in the oracle: stage 1
    with clipping active (norms and weights bitwise), stage 3 with clipping inactive (weights bitwise, norms
    printed and bounded) and active (norms and weights printed and bounded: the engine sums the partitions'
    squares in another order);
  - gradient accumulation (2 micro-batches, the engine's micro-steps) at stage 1 against an oracle that
    accumulates then averages, and at stage 3 against one that averages each micro-step then adds (the two
    orders the engine uses), bit for bit;
  - forward_only (infer_batch) gives the oracle model's outputs bitwise, under no_grad, with no update;
  - lr_scheduler_step follows DeepSpeed's WarmupLR formula (min + (max - min) x last_batch_iteration / steps);
    a checkpoint saved at stage 3 after 4 steps and loaded at stage 1 continues to the oracle's 8-step weights bitwise;
  - negative control: a perturbed oracle (lr x 1.0001) differs;
  - refused calls raise tessera.Error: to("cuda"), a data-parallel group, a batch that is not the config's
    micro-batches, optimizer_step or a second forward_backward_batch in the middle of a batch, an HDFS path, a
    max_ckpt_to_keep other than the config's tessera.checkpoint.keep_last, and an update made with a non-finite
    norm (NaN on rank 1 only: both ranks raise).
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 verl_adapter.py"""
import math
import os
import shutil
import tempfile

import torch

import tessera
from checks import Checks
from mlp_task import NAMES, model_of, rows
from pytorch_oracle import ClippedAdamW, train_averaged
from tessera.integrations.verl import TesseraVerlEngine

STEPS, MICRO, LR, DECAY = 8, 4, 3e-3, 0.01
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
mse = torch.nn.functional.mse_loss
check = Checks(f"rank {rank}")
expect = check.expect


def expect_error(words, call):
    check.expect_error(tessera.Error, words, call)


def loss_function(model_output, micro_batch):
    loss = mse(model_output, micro_batch["y"])
    return loss, {"mse": loss.item()}


def config(stage, gas=1, clip=None, **extra):
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
         "optimizer": {"type": "AdamW",
                       "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": DECAY}},
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000, "stage3_param_persistence_threshold": 100},
         "tessera": {"transport": {"collective_timeout_ms": 60000}}}
    if clip is not None:
        c["gradient_clipping"] = clip
    c.update(extra)
    return c


def adapter(cfg):
    return TesseraVerlEngine(model_of(), cfg, forward_fn=lambda model, mb: model(mb["x"])).initialize()


def train(engine, first, last, gas=1):
    """Steps first..last-1 through train_batch; returns the norms optimizer_step reported."""
    norms = []
    with engine.train_mode():
        for step in range(first, last):
            x, y = rows(step, rank, MICRO * gas)
            out = engine.train_batch({"x": x, "y": y, "note": "not a tensor"}, loss_function)
            norms.append(out["metrics"]["grad_norm"])
    return norms


def exported(engine):
    tensors, peft_config = engine.get_per_tensor_param()
    expect(peft_config is None, f"get_per_tensor_param's PEFT config is {peft_config}")
    return dict(tensors)  # kept past the walk, as a consumer that buckets them does (ZeRO-3 yields copies)


def oracle(lr=LR, clip=None, gas=1, reduce_each_micro_step=False):
    """(name -> weight after STEPS steps, the norms before clipping). gas > 1: each rank's batch is gas
    micro-batches, each loss divided by gas; the gradients are accumulated then averaged over the ranks (stages
    0-1), or averaged each micro-step then added (reduce_each_micro_step: partitioned gradients)."""
    model = model_of()
    adamw = ClippedAdamW(model.parameters(), clip, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=DECAY)

    def micro_loss(model, step, r, m):
        x, y = rows(step, r, MICRO * gas)
        return mse(model(x[m * MICRO:(m + 1) * MICRO]), y[m * MICRO:(m + 1) * MICRO]) / gas if gas > 1 else \
            mse(model(x), y)

    if not reduce_each_micro_step:
        def loss_of(model, step, r):  # the earlier micro-batches' backwards accumulate first, as the engine's do
            for m in range(gas - 1):
                micro_loss(model, step, r, m).backward()
            return micro_loss(model, step, r, gas - 1)

        weights = train_averaged(model, adamw, loss_of, STEPS, world)
    else:
        params = list(model.parameters())
        for step in range(STEPS):
            total = None
            for m in range(gas):
                sums = None
                for r in range(world):
                    adamw.zero_grad(set_to_none=True)
                    micro_loss(model, step, r, m).backward()
                    grads = [p.grad.clone() for p in params]
                    sums = grads if sums is None else [s.add_(g) for s, g in zip(sums, grads)]
                average = [s.div_(world) for s in sums]
                total = average if total is None else [t.add_(a) for t, a in zip(total, average)]
            for p, t in zip(params, total):
                p.grad = t
            adamw.step()
        weights = [p.detach().clone() for p in params]
    return dict(zip(NAMES, weights)), adamw.norms


def max_diff(got, want):
    return max((got[n] - want[n]).abs().max().item() for n in NAMES)


def same(got, want):
    """Every weight, bit for bit (ZeRO-3 exports unit by unit: another order than named_parameters())."""
    return sorted(got) == sorted(NAMES) and all(torch.equal(got[n], want[n]) for n in NAMES)


def relative(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# Plain training, stages 1-3: per-tensor export equals the oracle bit for bit; without clipping there is no norm.
expected, _ = oracle()
for stage in (1, 2, 3):
    engine = adapter(config(stage))
    norms = train(engine, 0, STEPS)
    got = exported(engine)
    expect(same(got, expected), f"stage {stage}: exported weights differ from the oracle by {max_diff(got, expected)}")
    expect(norms == [None] * STEPS, f"stage {stage}: optimizer_step without gradient_clipping returned {norms[:2]}...")
    meta = engine.engine.weight_metadata()
    expect([(m.name, m.dtype, m.shape) for m in meta] == [(n, got[n].dtype, tuple(got[n].shape)) for n in NAMES],
           f"stage {stage}: weight_metadata {meta} does not describe the export")

# Clipping: stage 1 active (the engine runs LibTorch's clip_grad_norm_ on the averaged gradients), stage 3
# inactive and active (the partitions' squares summed across ranks: close, not bitwise).
closeness = {}
for stage, clip in ((1, 0.5), (3, 100.0), (3, 0.5)):
    want, want_norms = oracle(clip=clip)
    engine = adapter(config(stage, clip=clip))
    norms = train(engine, 0, STEPS)
    got = exported(engine)
    clipped = sum(n > clip for n in want_norms)
    expect(clipped > 0 if clip < 1 else clipped == 0, f"clip {clip}: the oracle clipped {clipped} of {STEPS} steps")
    key = f"stage {stage} clip {clip}"
    closeness[key] = (relative(norms, want_norms), max_diff(got, want))
    if stage == 1:
        expect(norms == want_norms, f"{key}: norms {norms} differ from the oracle's {want_norms}")
        expect(same(got, want), f"{key}: weights differ from the oracle by {max_diff(got, want)}")
    else:
        expect(closeness[key][0] < 1e-6, f"{key}: norms differ from the oracle's by {closeness[key][0]} (relative)")
        if clip > 1:  # a coefficient clamped at 1 multiplies by 1.0 exactly
            expect(same(got, want), f"{key}: weights differ from the oracle by {max_diff(got, want)}")
        else:
            expect(closeness[key][1] < 1e-5, f"{key}: weights differ from the oracle by {closeness[key][1]}")

# Gradient accumulation: 2 micro-batches per batch, each an engine micro-step.
for stage, per_micro_step in ((1, False), (3, True)):
    want, _ = oracle(gas=2, reduce_each_micro_step=per_micro_step)
    engine = adapter(config(stage, gas=2))
    train(engine, 0, STEPS, gas=2)
    got = exported(engine)
    expect(engine.engine.global_steps == STEPS, f"stage {stage} gas 2: {engine.engine.global_steps} updates")
    expect(same(got, want), f"stage {stage} gas 2: weights differ from the oracle by {max_diff(got, want)}")

    # forward_only: the oracle's model on the same micro-batches, no graph, no update.
    reference = model_of()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(want[name])
    x, y = rows(99, rank, 3 * MICRO)
    with engine.eval_mode():
        out = engine.infer_batch({"x": x, "y": y}, loss_function)
    with torch.no_grad():
        ref = torch.cat([reference(x[i:i + MICRO]) for i in range(0, 3 * MICRO, MICRO)])
    expect(torch.equal(out["model_output"], ref) and not out["model_output"].requires_grad,
           f"stage {stage}: infer_batch's outputs differ from the oracle model's by "
           f"{(out['model_output'] - ref).abs().max()}")
    expect(len(out["loss"]) == 3 and len(out["metrics"]["mse"]) == 3 and engine.engine.global_steps == STEPS,
           f"stage {stage}: infer_batch gave {out['loss']}, {engine.engine.global_steps} updates")
    expect(engine.module.training, f"stage {stage}: eval_mode did not restore training mode")

# The lr: constant without a scheduler; with WarmupLR, DeepSpeed's linear warm-up for the next update.
engine = adapter(config(1))
train(engine, 0, 1)
expect(engine.lr_scheduler_step() == LR, f"lr_scheduler_step without a scheduler: {engine.lr_scheduler_step()}")
warm = {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": LR, "warmup_num_steps": 10,
                                       "warmup_type": "linear"}}
engine = adapter(config(1, scheduler=warm))
for k in range(1, 4):
    train(engine, k - 1, k)
    want_lr = 1e-4 + (LR - 1e-4) * (k - 1) / 10  # last_batch_iteration is k - 1 after k updates, as DeepSpeed's
    expect(abs(engine.lr_scheduler_step() - want_lr) <= 1e-12 * want_lr,
           f"WarmupLR after {k} updates: lr_scheduler_step {engine.lr_scheduler_step()}, DeepSpeed's formula {want_lr}")

# Checkpoint: saved at stage 3 after 4 steps, loaded at stage 1, 4 more: the oracle's 8-step weights.
work = os.path.join(tempfile.gettempdir(), f"tessera_verl_adapter_{os.environ.get('TESSERA_JOB', 'solo')}")
if rank == 0:
    shutil.rmtree(work, ignore_errors=True)
engine = adapter(config(3))
train(engine, 0, STEPS // 2)
expect_error(["HDFS"], lambda: engine.save_checkpoint(work, hdfs_path="hdfs://x"))
expect_error(["keep_last"], lambda: engine.save_checkpoint(work, max_ckpt_to_keep=2))
engine.save_checkpoint(work, global_step=4)
resumed = adapter(config(1))
resumed.load_checkpoint(work)
expect(resumed.engine.global_steps == STEPS // 2, f"load_checkpoint: {resumed.engine.global_steps} updates")
train(resumed, STEPS // 2, STEPS)
got = exported(resumed)
expect(same(got, expected), f"resumed at stage 1: weights differ from the oracle by {max_diff(got, expected)}")

# Negative control: an oracle with another lr must not match.
perturbed, _ = oracle(lr=LR * 1.0001)
expect(not same(perturbed, expected), "the perturbed oracle equals the oracle")

# Refused calls.
engine = adapter(config(1, gas=2, clip=1.0))
expect(engine.get_data_parallel_rank() == rank and engine.get_data_parallel_size() == world, "data-parallel rank/size")
engine.to("cpu")
engine.to("cpu", model=True, optimizer=False, grad=False)
expect_error(["cuda", "issue 25"], lambda: engine.to("cuda"))
expect_error(["cuda:1"], lambda: engine.to("cuda:1", optimizer=False))
expect_error(["grad"], lambda: engine.to("cpu", model=False))
group = engine.get_data_parallel_group()  # every launched rank here (no mpu): tessera.comm's collectives take it
check.expect(isinstance(group, tessera.comm.ProcessGroup) and group.ranks == tuple(range(world)),
             f"get_data_parallel_group: {group!r}")
check.expect(engine.get_data_parallel_rank() == rank and engine.get_data_parallel_size() == world,
             "get_data_parallel_rank / size")
expect_error(["not at the end of a batch"], engine.optimizer_step)
x, y = rows(0, rank, 2 * MICRO)
expect_error(["2 x 4"], lambda: engine.forward_backward_batch({"x": x[:5], "y": y[:5]}, loss_function))
expect_error(["one batch size"], lambda: engine.forward_backward_batch({"x": x, "y": y[:5]}, loss_function))
engine.forward_backward_batch({"x": x, "y": y}, loss_function)
expect_error(["middle of a batch"], lambda: engine.forward_backward_batch({"x": x, "y": y}, loss_function))
norm = engine.optimizer_step()  # the refusals changed nothing: the batch's update goes ahead
expect(norm is not None and math.isfinite(norm) and engine.engine.global_steps == 1, f"after the refusals: {norm}")
if rank == 1:
    y[0, 0] = float("nan")  # one rank's NaN reaches every rank's averaged gradients
engine.forward_backward_batch({"x": x, "y": y}, loss_function)
expect_error(["nan", "update was applied"], engine.optimizer_step)

report = "; ".join(f"{k}: norms within {n:.1e} (relative), weights within {w:.1e}" for k, (n, w) in closeness.items())
check.finish(f"verl adapter ok ({report})")
