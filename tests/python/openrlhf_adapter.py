#!/usr/bin/env python3
"""tessera.integrations.openrlhf (OpenRLHF's DeepSpeed strategy) against single-process PyTorch oracles, 2 ranks
under tools/tessera-launch, fp32. It tests the adapter against DeepspeedStrategy's interface as documented
(openrlhf/utils/deepspeed/deepspeed.py, read, not imported: OpenRLHF is not installed and there is no network
here), not against OpenRLHF itself.

Checked, with an MLP trained for 8 steps the way OpenRLHF's trainers do (engine forward, strategy.backward,
strategy.optimizer_step) from create_optimizer's two groups (no weight decay on biases):
  - the weights equal the oracle's bit for bit (pytorch_oracle.train_averaged stepping torch.optim.AdamW over the
    same two groups, built here by name): stage 1 with max_norm clipping active (the engine's norm equals the
    oracle's clip_grad_norm_ norm bitwise), stage 3 with clipping inactive (norms printed and bounded), and stage 1
    with 2 accumulation micro-steps (derived by the engine from train_batch_size) against an oracle that
    accumulates then averages;
  - save_ckpt at stage 3 after 4 steps (a tag, a client_state) and load_ckpt at stage 1 return the client_state and
    continue to the oracle's 8-step weights bitwise; max_ckpt_num = 2 keeps the newest 2 of 3 tags;
  - save_model's model.safetensors holds the oracle's weights bitwise (read by a plain reader), the tokenizer is
    saved on rank 0 only;
  - an eval model at stage 3 (tessera's ZeRO inference engine) gives the plain module's outputs bitwise; below
    stage 3 prepare returns the module itself;
  - negative controls: a perturbed oracle (lr x 1.0001) and an oracle that decays the biases differ;
  - a client LambdaLR passed to prepare sets the engine's lr after every update as torch's formula says;
    all_reduce (mean / max / sum, numbers, tensors and dicts) and all_gather against values computed here;
  - offload_states / reload_states: the weights have no memory in between and come back bit for bit;
  - refused: args.adam_offload, save_ckpt with
    another max_num, save_pretrained options; get_rank / world_size / is_rank_0 / print follow the launch
    environment.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 openrlhf_adapter.py"""
import contextlib
import io
import os
import shutil
import tempfile
import types

import torch

import tessera
from checks import Checks
from hf_dir import read_safetensors
from mlp_task import NAMES, model_of, rows
from pytorch_oracle import ClippedAdamW, train_averaged
from tessera.integrations.openrlhf import TesseraStrategy

STEPS, MICRO, LR, DECAY, BETAS = 8, 4, 3e-3, 0.1, (0.9, 0.95)
rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
mse = torch.nn.functional.mse_loss
TIMEOUT = {"tessera": {"transport": {"collective_timeout_ms": 60000}}}
check = Checks(f"rank {rank}")
expect, expect_error = check.expect, check.expect_error


def strategy_of(stage, clip=0.0, gas=1, **kwargs):
    s = TesseraStrategy(seed=7, max_norm=clip, micro_train_batch_size=MICRO, train_batch_size=MICRO * gas * world,
                        zero_stage=stage, args=types.SimpleNamespace(param_dtype="fp32"), config=TIMEOUT, **kwargs)
    s.setup_distributed()
    return s


def prepared(strategy):
    model = model_of()
    optim = strategy.create_optimizer(model, lr=LR, betas=BETAS, weight_decay=DECAY)
    return strategy.prepare((model, optim, None))


def train(strategy, engine, optim, scheduler, first, last, gas=1):
    """OpenRLHF's loop: one backward and one optimizer_step per micro-batch; returns the norm after each update."""
    norms = []
    for step in range(first, last):
        x, y = rows(step, rank, MICRO * gas)
        for m in range(gas):
            loss = mse(engine(x[m * MICRO:(m + 1) * MICRO]), y[m * MICRO:(m + 1) * MICRO])
            strategy.backward(loss, engine, optim)
            strategy.optimizer_step(optim, engine, scheduler)
        norms.append(engine.get_global_grad_norm())
    return norms


def weights(engine):
    with engine.gathered_parameters():  # whole at ZeRO-3; nothing to do below it
        return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def oracle(lr=LR, clip=0.0, gas=1, decay_biases=False):
    """(name -> weight after STEPS steps, norms before clipping); biases without weight decay unless decay_biases.
    gas > 1: each loss divided by gas, micro-batch gradients accumulated, then averaged over the ranks."""
    model = model_of()
    named = dict(model.named_parameters())
    biases = [] if decay_biases else [n for n in NAMES if n.endswith("bias")]
    groups = [{"params": [named[n] for n in NAMES if n not in biases], "weight_decay": DECAY},
              {"params": [named[n] for n in biases], "weight_decay": 0.0}]
    adamw = ClippedAdamW([g for g in groups if g["params"]], clip, lr=lr, betas=BETAS, eps=1e-8)

    def loss_of(model, step, r):
        x, y = rows(step, r, MICRO * gas)
        losses = [mse(model(x[m * MICRO:(m + 1) * MICRO]), y[m * MICRO:(m + 1) * MICRO]) for m in range(gas)]
        for loss in losses[:-1]:  # the earlier micro-batches' backwards accumulate first, as the engine's do
            (loss / gas).backward()
        return losses[-1] / gas if gas > 1 else losses[-1]

    return dict(zip(NAMES, train_averaged(model, adamw, loss_of, STEPS, world))), adamw.norms


def max_diff(got, want):
    return max((got[n] - want[n]).abs().max().item() for n in NAMES)


def same(got, want):
    return sorted(got) == sorted(NAMES) and all(torch.equal(got[n], want[n]) for n in NAMES)


expected, _ = oracle()
closeness = {}
for stage, clip, gas in ((1, 0.5, 1), (3, 100.0, 1), (1, 0.0, 2)):
    key = f"stage {stage} max_norm {clip} accumulation {gas}"
    want, want_norms = oracle(clip=clip, gas=gas)
    strategy = strategy_of(stage, clip, gas)
    expect(strategy.accumulated_gradient == gas, f"{key}: accumulated_gradient {strategy.accumulated_gradient}")
    engine, optim, scheduler = prepared(strategy)
    norms = train(strategy, engine, optim, scheduler, 0, STEPS, gas)
    got = weights(engine)
    expect(engine.global_steps == STEPS, f"{key}: {engine.global_steps} updates")
    expect(same(got, want), f"{key}: weights differ from the oracle by {max_diff(got, want)}")
    if not clip:
        expect(norms == [None] * STEPS, f"{key}: a norm without clipping: {norms[:2]}")
        continue
    expect((sum(n > clip for n in want_norms) > 0) == (clip < 1), f"{key}: the oracle's norms {want_norms}")
    closeness[key] = max(abs(a - b) / b for a, b in zip(norms, want_norms))
    if stage == 1:
        expect(norms == want_norms, f"{key}: norms {norms} differ from the oracle's {want_norms}")
    else:
        expect(closeness[key] < 1e-6, f"{key}: norms differ from the oracle's by {closeness[key]} (relative)")

# Checkpoints: stage 3 saves after 4 steps; stage 1 loads (the client_state comes back) and trains 4 more.
work = os.path.join(tempfile.gettempdir(), f"tessera_openrlhf_adapter_{os.environ.get('TESSERA_JOB', 'solo')}")
if rank == 0:
    shutil.rmtree(work, ignore_errors=True)
strategy = strategy_of(3)
engine, optim, scheduler = prepared(strategy)
train(strategy, engine, optim, scheduler, 0, STEPS // 2)
expect_error(tessera.ConfigError, ["max_num = 5"], lambda: strategy.save_ckpt(engine, work, "step4", 5, None, {}))
strategy.save_ckpt(engine, os.path.join(work, "ckpt"), "step4", 3, None, {"global_step": 4, "episode": 1})

resumed_strategy = strategy_of(1)
resumed, resumed_optim, _ = prepared(resumed_strategy)
path, client_state = resumed_strategy.load_ckpt(resumed, os.path.join(work, "ckpt"))
expect(client_state == {"global_step": 4, "episode": 1} and path.endswith("step4") and resumed.global_steps == 4,
       f"load_ckpt gave {path}, {client_state}, step {resumed.global_steps}")
train(resumed_strategy, resumed, resumed_optim, None, STEPS // 2, STEPS)
got = weights(resumed)
expect(same(got, expected), f"resumed at stage 1: weights differ from the oracle by {max_diff(got, expected)}")


# save_model: the oracle's weights (read back by a plain safetensors reader); the tokenizer on rank 0 only.
class Tokenizer:
    def save_pretrained(self, output_dir):
        open(os.path.join(output_dir, f"tokenizer_rank{rank}"), "w").close()


train(strategy, engine, optim, scheduler, STEPS // 2, STEPS)  # the stage-3 run to 8 steps, then exported
export = os.path.join(work, "export")
expect_error(tessera.ConfigError, ["max_shard_size"],
             lambda: strategy.save_model(engine, None, export, max_shard_size="5GB"))
strategy.save_model(engine, Tokenizer(), export)
saved = read_safetensors(os.path.join(export, "model.safetensors"))
for name in NAMES:
    expect(torch.equal(saved[name], expected[name]), f"save_model: '{name}' differs from the oracle")
if rank == 0:
    expect(sorted(f for f in os.listdir(export) if f.startswith("tokenizer")) == ["tokenizer_rank0"],
           f"save_model: tokenizer files {os.listdir(export)}")

# max_ckpt_num = 2: the engine keeps the newest two of three tags.
keeper = strategy_of(1, max_ckpt_num=2)
kept, kept_optim, _ = prepared(keeper)
for i in range(3):
    train(keeper, kept, kept_optim, None, i, i + 1)
    keeper.save_ckpt(kept, os.path.join(work, "kept"), f"t{i}", 2, None)
if rank == 0:
    tags = sorted(d for d in os.listdir(os.path.join(work, "kept")) if not d.startswith(".") and d != "latest")
    expect(tags == ["t1", "t2"], f"max_ckpt_num 2 kept {tags}")

# Eval models: at stage 3 tessera's ZeRO inference engine, below it the module itself.
x, _ = rows(42, rank, MICRO)
with torch.no_grad():
    plain = model_of()(x)
    reference = strategy_of(3).prepare(model_of())
    expect(isinstance(reference, tessera.TesseraEngine) and torch.equal(reference(x), plain),
           "stage 3 eval model: outputs differ from the plain module's")
module = model_of()
expect(strategy_of(1).prepare(module) is module, "stage 1 eval model: not the module itself")

# Negative controls: another lr, and weight decay on the biases (what create_optimizer's groups leave out).
for what, (other, _) in (("lr x 1.0001", oracle(lr=LR * 1.0001)), ("decayed biases", oracle(decay_biases=True))):
    expect(not same(other, expected), f"the oracle with {what} equals the oracle")

# Refused, and the rank helpers.
# offload_states/reload_states around generation: every state to host memory (the weights without memory), back bit
# for bit.
with engine.gathered_parameters():
    kept = [p.detach().clone() for p in engine.module.parameters()]
moved = strategy.offload_states(engine)
expect(moved["optimizer_states"] > 0 and moved["parameters"] > 0, f"offload_states moved {moved}")
expect(sum(p.storage().nbytes() for p in engine.module.parameters()) == 0, "the weights kept their memory")
expect(strategy.reload_states(engine) == moved, "reload_states did not bring back what offload_states moved")
with engine.gathered_parameters():
    expect(all(torch.equal(p, k) for p, k in zip(engine.module.parameters(), kept)), "the weights changed over offload_states")
expect_error(tessera.Error, ["give the engine"], lambda: strategy.offload_states(None))
expect_error(tessera.ConfigError, ["adam_offload", "issue 25"],
             lambda: TesseraStrategy(args=types.SimpleNamespace(param_dtype="fp32", adam_offload=True)))
expect_error(tessera.Error, ["prepare() returned"], lambda: strategy.backward(torch.zeros(()), model_of(), None))
model = model_of()
# A client scheduler (OpenRLHF always passes one): torch's LambdaLR sets the engine's lr after every update.
schedule = torch.optim.lr_scheduler.LambdaLR(strategy.create_optimizer(model, lr=LR, weight_decay=DECAY),
                                             lambda s: 0.5 ** s)
engine, optim, returned = strategy.prepare((model, schedule.optimizer, schedule))
expect(returned is schedule, "prepare did not return the client's scheduler")
for k in range(3):
    expect(engine.get_lr() == [LR * 0.5 ** k] * 2, f"update {k}: lr {engine.get_lr()}, LambdaLR says {LR * 0.5 ** k}")
    x, y = rows(k, rank, MICRO)
    strategy.backward(mse(engine(x), y), engine, optim)
    strategy.optimizer_step(optim, engine, returned)
# Collectives over every rank, as OpenRLHF's strategy offers them.
reduced = strategy.all_reduce({"n": float(rank + 1), "t": torch.full((2,), float(rank))}, op="mean")
expect(reduced["n"] == (1 + world) / 2 and torch.equal(reduced["t"], torch.full((2,), (world - 1) / 2)), f"{reduced}")
expect(strategy.all_reduce(rank, op="max") == world - 1 and strategy.all_reduce(1.0, op="sum") == world, "max / sum")
gathered = strategy.all_gather(torch.tensor([rank, 10 * rank]))
expect(torch.equal(gathered, torch.tensor([v for r in range(world) for v in (r, 10 * r)])), f"all_gather {gathered}")
expect(strategy.get_rank() == rank and strategy.world_size == world and strategy.is_rank_0() == (rank == 0),
       "get_rank / world_size / is_rank_0")
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    strategy.print("hello")
expect(printed.getvalue() == ("hello\n" if rank == 0 else ""), f"print gave {printed.getvalue()!r}")

report = "; ".join(f"{k}: norms within {v:.1e} (relative)" for k, v in closeness.items())
check.finish(f"openrlhf adapter ok ({report})")
