#!/usr/bin/env python3
"""The GRPO main job's training side in Python (`import tessera as deepspeed` style), against the C++ rollout job:
examples/grpo/grpo.cpp's `--role train`, line for line, on examples/python/decoder.py. Started by
examples/grpo/run_grpo.py --python-train (which starts the C++ rollout job beside it); the two jobs exchange prompts
and samples through the store (tessera.store) and weights over UCX (engine.sync_weights).

With the same options it computes what the C++ training side computes, in the same operations and order: the same
initial weights (each drawn from a generator seeded by the parameter's name), prompts (std::mt19937_64), warm-up,
rewards, advantages and loss, so the per-step rewards match the C++ main job's (tests/rollout/grpo_python.py checks
it). Options the C++ job has and this one does not yet (--kl-beta, --epochs > 1, --advantage position, an lr
schedule, --entropy-coef, --save-every, --resume) are refused, not ignored; --checkpoint-dir saves at the end."""
import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tessera  # noqa: E402
from decoder import Decoder, initialise  # noqa: E402
from mt19937_64 import Mt19937_64  # noqa: E402

EQUALS, NEWLINE = ord("="), ord("\n")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["train"], required=True)
    ap.add_argument("--peer-job", required=True)
    ap.add_argument("--model-config", default="examples/grpo/policy")
    ap.add_argument("--csv", default="grpo.csv")
    for name, default in (("steps", 250), ("prompts", 16), ("group", 8), ("sft-steps", 8), ("zero-stage", 2),
                          ("digits", 3), ("epochs", 1), ("lr-warmup", 0), ("seed", 1)):
        ap.add_argument("--" + name, type=int, default=default)
    for name, default in (("lr", 1e-3), ("sft-lr", 3e-3), ("temperature", 1.0), ("clip", 0.2), ("kl-beta", 0.0),
                          ("max-grad-norm", 1.0), ("beta1", 0.9), ("beta2", 0.99), ("entropy-coef", 0.0)):
        ap.add_argument("--" + name, type=float, default=default)
    ap.add_argument("--advantage", default="sequence")
    ap.add_argument("--lr-schedule", default="constant")
    ap.add_argument("--no-std-norm", action="store_true")
    ap.add_argument("--sync-mode", default="in_place")  # the rollout's; the sender does not depend on it
    ap.add_argument("--rollout-dtype", default="fp32")   # the rollout's; the sync casts to what it announces
    ap.add_argument("--delta", action="store_true")
    ap.add_argument("--offload", choices=["none", "cpu"], default="none")
    ap.add_argument("--checkpoint-dir", default="")
    a = ap.parse_args()
    missing = [f"--{k} {v}" for k, v, default in (("kl-beta", a.kl_beta, 0.0), ("epochs", a.epochs, 1),
                                                   ("advantage", a.advantage, "sequence"), ("lr-warmup", a.lr_warmup, 0),
                                                   ("lr-schedule", a.lr_schedule, "constant"),
                                                   ("entropy-coef", a.entropy_coef, 0.0)) if v != default]
    if missing:
        sys.exit(f"grpo_train.py: not in the Python training side yet: {', '.join(missing)} (use the C++ one)")
    return a


def random_prompt(rng, digits):
    return [ord("0") + rng() % 10 for _ in range(digits)] + [EQUALS]


def answer(prompt):
    return prompt[-2::-1] + [NEWLINE]


def reward(prompt, completion):
    want, digits = answer(prompt), len(prompt) - 1
    return sum(i < len(completion) and completion[i] == want[i] for i in range(digits)) / digits


def decode_samples(text):
    tokens, logprobs = [], []
    for line in text.splitlines():
        words = line.split()
        n = int(words[0])
        tokens.append([int(w) for w in words[1:1 + n]])
        logprobs.append([float.fromhex(w) for w in words[1 + n:1 + 2 * n]])  # hex floats: the rollout's bits
    return tokens, logprobs


def normalise(scores, prompts, group, std_norm):
    out = []
    for g in range(prompts):
        s = scores[g * group:(g + 1) * group]
        m = 0.0
        for x in s:
            m += x / group
        v = 0.0
        for x in s:
            v += math.pow(x - m, 2) / max(1, group - 1)
        out += [(x - m) / (math.sqrt(v) + 1e-6 if std_norm else 1.0) for x in s]
    return out


def make_engine(a, model_config, share):
    policy = Decoder(model_config)
    initialise(policy, a.seed)
    ds_config = {"train_micro_batch_size_per_gpu": share, "gradient_accumulation_steps": 1,
                 "gradient_clipping": a.max_grad_norm,
                 "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [a.beta1, a.beta2], "weight_decay": 0.0}},
                 "zero_optimization": {"stage": a.zero_stage}}
    if a.zero_stage == 3:  # DeepSpeed's "auto" rule (10 x hidden): only the norms stay gathered
        ds_config["zero_optimization"]["stage3_param_persistence_threshold"] = 10 * model_config["hidden_size"]
    if a.offload == "cpu":  # the optimizer's masters, states and step in host memory
        ds_config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    engine, optimizer, _, _ = tessera.initialize(model=policy, config=ds_config)
    return policy, engine, optimizer


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


def warm_up(engine, optimizer, a, rank, share):
    """Supervised steps on (prompt, answer) pairs: the format, and a start on the task."""
    D, P = a.digits, a.digits + 1
    rng = Mt19937_64(a.seed * 7919 + rank)
    for _ in range(a.sft_steps):
        rows = []
        for _ in range(share):
            p = random_prompt(rng, D)
            rows.append(p + answer(p))
        ids = torch.tensor(rows, dtype=torch.long)
        logits = engine(ids[:, :-1])
        answer_logits = logits[:, P - 1:P + D]
        loss = torch.nn.functional.cross_entropy(answer_logits.reshape(-1, answer_logits.shape[-1]),
                                                 ids[:, P:P + D + 1].reshape(-1))
        set_lr(optimizer, a.sft_lr)
        engine.backward(loss)
        engine.step()
    set_lr(optimizer, a.lr)


def score(a, prompts, tokens, rollout_lp):
    """Rewards and their figures, over every sample (every rank computes all; cheap)."""
    n = len(tokens)
    rewards = [reward(prompts[i // a.group], tokens[i]) for i in range(n)]
    mean_reward = 0.0
    for r in rewards:
        mean_reward += r / n
    total_tokens = sum(len(c) for c in tokens)
    return {"advantages": normalise(rewards, a.prompts, a.group, not a.no_std_norm), "reward": mean_reward,
            "tokens": total_tokens, "neg_logprob": -sum(lp for row in rollout_lp for lp in row) / max(1, total_tokens),
            "position_right": [sum(k < len(tokens[i]) and tokens[i][k] == answer(prompts[i // a.group])[k]
                                   for i in range(n)) / n for k in range(a.digits)]}


def rank_batch(a, rank, share, prompts, tokens, rollout_lp, advantages):
    """This rank's share: prompt + completion (right-padded), the completion mask, advantages, rollout log-probs."""
    P = T = a.digits + 1
    begin = rank * share
    ids = torch.zeros(share, P + T, dtype=torch.long)
    mask, old_rollout = torch.zeros(share, T), torch.zeros(share, T)
    adv = torch.tensor([[advantages[begin + i]] * T for i in range(share)], dtype=torch.float32)
    for i in range(share):
        p, c = prompts[(begin + i) // a.group], tokens[begin + i]
        ids[i, :P] = torch.tensor(p)
        if c:
            ids[i, P:P + len(c)] = torch.tensor(c)
            mask[i, :len(c)] = 1
            old_rollout[i, :len(c)] = torch.tensor(rollout_lp[begin + i], dtype=torch.float32)
    return ids, mask, adv, old_rollout


def update(engine, a, world, total_tokens, ids, mask, adv, old_rollout):
    """One clipped-ratio update (pi_old: the policy before it); returns its loss, the training-vs-rollout log-prob
    mismatch and the policy's mean entropy at the answer tokens."""
    P = T = a.digits + 1
    logits = engine(ids[:, :P + T - 1])[:, P - 1:P - 1 + T]
    all_logp = torch.log_softmax(logits, -1)
    entropy = -(all_logp.exp() * all_logp).sum(-1)
    logp = all_logp.gather(-1, ids[:, P:P + T].unsqueeze(-1)).squeeze(-1)
    entropy_mean = (entropy.detach() * mask).sum().item() / max(1.0, mask.sum().item())
    old = logp.detach()
    mismatch = ((old - old_rollout).abs() * mask).sum().item() / max(1.0, mask.sum().item())
    ratio = torch.exp(logp - old)
    objective = torch.min(ratio * adv, torch.clamp(ratio, 1 - a.clip, 1 + a.clip) * adv)
    # Token-level normalisation over the whole batch: the engine averages the ranks' gradients.
    loss = (-objective * mask).sum() * (float(world) / float(max(1, total_tokens)))
    engine.backward(loss)
    engine.step()
    return loss.item() / world, mismatch, entropy_mean


def csv_header(a):  # the C++ job's columns
    return ("step,reward,kl,loss,logprob_mismatch,tokens_per_s,sync_ms,pause_ms,sync_bytes,generate_ms,step_ms,lr,"
            "neg_logprob,clip_frac,delta,changed_elements,full_bytes,rollout_wait_ms," +
            "".join(f"acc{k + 1}," for k in range(a.digits)) + "entropy\n")


def main():
    a = parse_args()
    config_path = os.path.join(a.model_config, "config.json") if os.path.isdir(a.model_config) else a.model_config
    with open(config_path) as f:
        model_config = json.load(f)
    rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
    sequences = a.prompts * a.group
    if sequences % world:
        sys.exit(f"grpo_train.py: --prompts x --group ({sequences}) must divide over {world} training ranks")
    share = sequences // world
    policy, engine, optimizer = make_engine(a, model_config, share)
    shared = tessera.store.shared("grpo")
    if rank == 0:
        shared.set("start_step", b"0")
    warm_up(engine, optimizer, a, rank, share)
    first = engine.sync_weights(model_config=model_config, train_job=os.environ["TESSERA_JOB"],
                                rollout_job=a.peer_job, session="grpo", delta=a.delta)
    csv = open(a.csv, "w") if rank == 0 else None
    if rank == 0:
        csv.write(csv_header(a))
        print(f"grpo (python): {sum(p.numel() for p in policy.parameters())}-parameter policy, {world} training ranks "
              f"(ZeRO-{a.zero_stage}), {a.prompts} prompts x {a.group} samples per step; first sync "
              f"{first['sync_ms']:.1f} ms", flush=True)
    prompt_rng = Mt19937_64(a.seed * 104729)
    for step in range(a.steps):
        t0 = time.monotonic()
        key = f"step{step}/"
        prompts = [random_prompt(prompt_rng, a.digits) for _ in range(a.prompts)]
        if rank == 0:
            shared.set(key + "prompts", "".join("".join(f"{t} " for t in p) + "\n" for p in prompts).encode())
        tokens, rollout_lp = decode_samples(shared.get(key + "samples", 300000).decode())
        if len(tokens) != sequences:
            sys.exit(f"grpo_train.py: the rollout job sent {len(tokens)} samples")
        s = score(a, prompts, tokens, rollout_lp)
        batch = rank_batch(a, rank, share, prompts, tokens, rollout_lp, s["advantages"])
        loss, mismatch, entropy_mean = update(engine, a, world, s["tokens"], *batch)
        sync = engine.sync_weights()
        pause_ms, generate_ms, _, rollout_wait_ms = (float(x) for x in shared.get(key + "rollout", 300000).decode().split())
        if rank == 0:
            step_ms, tokens_per_s = (time.monotonic() - t0) * 1000, s["tokens"] / (generate_ms / 1000.0)
            sync_ms = sync["sync_ms"] + sync["verify_ms"]
            print(f"step {step + 1:3d} | reward {s['reward']:.3f} | loss {loss:+.4f} | {tokens_per_s:.0f} tok/s | "
                  f"logprob mismatch {mismatch:.2e} | sync {sync_ms:.1f} ms | pause {pause_ms:.1f} ms", flush=True)
            row = [step + 1, s["reward"], 0.0, loss, mismatch, tokens_per_s, sync_ms, pause_ms, sync["bytes_sent"],
                   generate_ms, step_ms, a.lr, s["neg_logprob"], 0.0, int(sync["delta"]), sync["changed_elements"],
                   sync["full_bytes"], rollout_wait_ms]
            csv.write(",".join(f"{x:.6g}" if isinstance(x, float) else str(x)
                               for x in row + s["position_right"] + [entropy_mean]) + "\n")
            csv.flush()
    if a.checkpoint_dir:  # the policy and optimizer at the end (the C++ job also saves every --save-every steps)
        engine.save_checkpoint(a.checkpoint_dir, client_state={"step": a.steps})
        if rank == 0:
            print(f"grpo (python): saved checkpoint in {a.checkpoint_dir} (GRPO step {a.steps})", flush=True)
    if rank == 0:
        csv.close()
        print(f"grpo (python): done, {a.steps} steps; curve in {a.csv}", flush=True)
    engine.destroy()  # returns once the engine's actors have ended (their teardown may take the GIL)


if __name__ == "__main__":
    main()
