#!/usr/bin/env python3
"""A DeepSpeed-style Python training loop on tessera (only the import differs) against a single-process PyTorch
oracle, bit for bit: 2 ranks (under tools/tessera-launch), ZeRO stages 0-3 (stage 3 through Python forward hooks), fp32, 30 steps of AdamW on an
MLP, and stages 2 and 3 with the optimizer offloaded to host memory. The oracle differentiates every rank's loss in this process, averages the gradients as the engine reduces
them ((g_0 + g_1) / 2) and steps torch.optim.AdamW. A stage-3 run saved after 15 steps and resumed at stage 1
from Python reaches the same weights; its save_16bit_model file holds the weights read by a plain reader. Also: the user's parameters are views of one flat buffer
after initialize (rewired in place, not copied), a perturbed oracle differs (negative control), and bad input
raises tessera's exception classes with the C++ message.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 train_parity.py"""
import sys

import torch

import tessera
from pytorch_oracle import train_averaged

STEPS, BATCH, LR, DECAY = 30, 8, 3e-3, 0.01
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
failures = []


def model_of():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


def batch(step, r):
    g = torch.Generator().manual_seed(10000 * step + r)
    return torch.randn(BATCH, 32, generator=g), torch.randn(BATCH, 8, generator=g)


def loss_of(model, step, r):
    x, y = batch(step, r)
    return torch.nn.functional.mse_loss(model(x), y)


def oracle(lr=LR):
    model = model_of()
    adamw = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=DECAY)
    return train_averaged(model, adamw, loss_of, STEPS, world)


def config(stage, offload=False):
    c = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                   "weight_decay": DECAY}},
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 2000,
                               "stage3_param_persistence_threshold": 100},
         "tessera": {"transport": {"collective_timeout_ms": 60000}}}
    if offload:  # the optimizer in host memory, stepped sub-group by sub-group
        c["zero_optimization"].update({"offload_optimizer": {"device": "cpu", "buffer_count": 2}, "sub_group_size": 1000})
    return c


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {rank}: FAILED: {what}", flush=True)


expected = oracle()
for stage, offload in ((0, False), (1, False), (2, False), (3, False), (2, True), (3, True)):
    model = model_of()
    engine, _, _, _ = tessera.initialize(model=model, model_parameters=model.parameters(), config=config(stage, offload))
    name = f"{stage} with optimizer offload" if offload else str(stage)
    if stage < 3:  # at stage 3 the parameters are released between uses
        storages = {p.storage().data_ptr() for p in model.parameters()}
        expect(len(storages) == 1, f"stage {name}: the parameters are not views of one flat buffer ({len(storages)} storages)")
    else:
        expect(model[0].weight.storage().data_ptr() == 0, "stage 3: a unit's weight holds memory outside its forward")
    for step in range(STEPS):
        loss = loss_of(engine, step, rank)
        engine.backward(loss)
        engine.step()
    expect(engine.global_steps == STEPS, f"stage {name}: global_steps {engine.global_steps}")
    with engine.gathered_parameters():  # whole on every rank (stage 3); a no-op at stages 0-2
        got = [p.detach().clone() for p in model.parameters()]
    for i, (g, e) in enumerate(zip(got, expected)):
        expect(torch.equal(g, e), f"stage {name}: parameter {i} differs from the oracle by {(g - e).abs().max().item()}")

# Checkpoints from Python: stage 3 saves after 15 steps, a new engine at stage 1 loads and trains 15 more: the
# oracle's 30-step weights, bit for bit; client_state comes back; save_16bit_model's file holds the weights.
import os, shutil, tempfile  # noqa: E402
from hf_dir import read_safetensors  # noqa: E402

work = os.path.join(tempfile.gettempdir(), f"tessera_python_parity_{os.environ.get('TESSERA_JOB', 'solo')}")
if rank == 0:
    shutil.rmtree(work, ignore_errors=True)
model = model_of()
engine, _, _, _ = tessera.initialize(model=model, config=config(3))
for step in range(15):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
engine.save_checkpoint(os.path.join(work, "ckpt"), client_state={"epoch": 3})
engine.save_16bit_model(os.path.join(work, "export"))
exported = read_safetensors(os.path.join(work, "export", "model.safetensors"))
with engine.gathered_parameters():
    for name, p in model.named_parameters():
        expect(torch.equal(exported[name], p.detach()), f"save_16bit_model: '{name}' differs from the weights")
# A gathered-parameters scope with a modifier rank writes that rank's change back to every rank's partition.
with engine.gathered_parameters(model[0].bias, modifier_rank=0):
    if rank == 0:
        with torch.no_grad():
            model[0].bias.fill_(0.5)
with engine.gathered_parameters():
    expect(bool((model[0].bias == 0.5).all()), "gathered_parameters(modifier_rank=0): the change did not reach every rank")
resumed = model_of()
engine, _, _, _ = tessera.initialize(model=resumed, config=config(1))
path, client_state = engine.load_checkpoint(os.path.join(work, "ckpt"))
expect(client_state == {"epoch": 3} and engine.global_steps == 15, f"load_checkpoint gave {client_state}, step {engine.global_steps}")
for step in range(15, STEPS):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
for i, (g, e) in enumerate(zip(resumed.parameters(), expected)):
    expect(torch.equal(g.detach(), e), f"resumed at stage 1: parameter {i} differs from the oracle")

# Asynchronous saves from Python (the config's tessera.checkpoint.async_save): the save returns at once and training
# goes on; the checkpoint holds the state at the save (loaded at stage 2 and trained on: the oracle's weights). A
# parameter changed in place before the next step() fails that save on every rank, naming the parameter.
async_config = dict(config(1), tessera={"transport": {"collective_timeout_ms": 60000}, "checkpoint": {"async_save": True}})
model = model_of()
engine, _, _, _ = tessera.initialize(model=model, config=async_config)
for step in range(15):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
engine.save_checkpoint(os.path.join(work, "async"), tag="at15")
for step in range(15, 18):  # the next update waits for the snapshot, not for the write
    engine.backward(loss_of(engine, step, rank))
    engine.step()
engine.wait_for_checkpoint()
resumed = model_of()
resumed_engine, _, _, _ = tessera.initialize(model=resumed, config=config(2))
resumed_engine.load_checkpoint(os.path.join(work, "async"))
for step in range(15, STEPS):
    resumed_engine.backward(loss_of(resumed_engine, step, rank))
    resumed_engine.step()
for i, (g, e) in enumerate(zip(resumed.parameters(), expected)):
    expect(torch.equal(g.detach(), e), f"asynchronous save resumed at stage 2: parameter {i} differs from the oracle")
engine.save_checkpoint(os.path.join(work, "async"), tag="changed")
if rank == 0:
    with torch.no_grad():
        model[0].weight.mul_(1.0)  # behind the engine's back, before the snapshot is certain to be done
try:
    engine.wait_for_checkpoint()
    changed_error = None
except tessera.CheckpointError as e:
    changed_error = str(e)
# The snapshot may have finished before the change (it runs beside this thread): then the save stands.
expect(changed_error is None or "parameter '0.weight' was changed in place" in changed_error,
       f"a parameter changed during the snapshot: {changed_error}")
expect((changed_error is None) == os.path.isdir(os.path.join(work, "async", "changed")),
       "a failed asynchronous save left its tag, or a good one did not")

# The optimizer and scheduler initialize returns: param_groups' lr reads and sets the engine's, per group; with a
# `scheduler` section the scheduler object reports the engine's lrs.
model = model_of()
groups = [{"params": [model[0].weight, model[2].weight, model[4].weight]},
          {"params": [model[0].bias, model[2].bias, model[4].bias], "weight_decay": 0.0, "lr": 1e-3}]
engine, optimizer, _, scheduler = tessera.initialize(model=model, model_parameters=groups, config=config(1))
expect(scheduler is None and len(optimizer.param_groups) == 2, "initialize without a scheduler: unexpected objects")
expect(optimizer.param_groups[1]["lr"] == 1e-3 and optimizer.param_groups[0]["lr"] == LR,
       f"param_groups lrs {[g['lr'] for g in optimizer.param_groups]}")
optimizer.param_groups[0]["lr"] = 0.5
expect(engine.get_lr() == [0.5, 1e-3], f"after setting group 0's lr: {engine.get_lr()}")
warm = dict(config(1), scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR,
                                                                  "warmup_num_steps": 10, "warmup_type": "linear"}})
model = model_of()
engine, optimizer, _, scheduler = tessera.initialize(model=model, config=warm)
lrs = []
for step in range(3):
    engine.backward(loss_of(engine, step, rank))
    engine.step()
    lrs.append(scheduler.get_last_lr()[0])
expect(scheduler.last_batch_iteration == 2 and lrs[0] <= lrs[1] < lrs[2] <= LR and engine.get_lr() == scheduler.get_lr(),
       f"WarmupLR from Python: lrs {lrs}, last_batch_iteration {scheduler.last_batch_iteration}")

# Negative control: an oracle with another lr must not match.
perturbed = oracle(lr=LR * 1.0001)
expect(not all(torch.equal(a, b) for a, b in zip(perturbed, expected)), "the perturbed oracle equals the oracle")

# Bad input: tessera's exception classes, the C++ messages.
for bad, cls, words in (({"train_micro_batch_size_per_gpu": 8, "optimizr": {}}, tessera.ConfigError, "did you mean"),
                        ({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 7}}, tessera.ConfigError, "stage")):
    try:
        tessera.initialize(model=model_of(), config=bad)
        expect(False, f"{bad} was accepted")
    except cls as e:
        expect(words in str(e), f"the error for {bad} does not say '{words}': {e}")
try:
    m = model_of()
    tessera.initialize(model=m, model_parameters=[torch.zeros(3)], config=config(1))
    expect(False, "a tensor that is not a parameter was accepted")
except tessera.ConfigError as e:
    expect("not a parameter" in str(e), f"unexpected message: {e}")

if failures:
    sys.exit(f"rank {rank}: {len(failures)} failure(s)")
print(f"rank {rank}: python parity ok (stages 0-3 bitwise equal to the PyTorch oracle after {STEPS} steps)", flush=True)
