#!/usr/bin/env python3
"""Weight sync from Python: a training job of 2 ranks trains a Python Llama/Qwen decoder (examples/python/decoder.py,
Hugging Face names) with tessera.initialize and pushes it with engine.sync_weights() into a rollout job of 2 TP ranks
(tessera.rollout.RolloutEngine + RolloutSink, C++), twice (after 3 and 6 steps). Started by tests/transport/two_jobs.py;
each job's role is TESSERA_UCX_ROLE.
The oracle, on every rollout rank: the same decoder trained by the single-process PyTorch oracle (gradients of both
ranks' losses averaged, torch.optim.AdamW), written as a Hugging Face directory and loaded into the same rollout
engine with load_weights(); greedy generation with log-probabilities after each sync must equal generation from the
oracle's weights bit for bit (tokens and every log-prob). Negative control: the oracle with one weight changed by
1e-3 gives other log-probs. Also: the versions the syncs publish (1, 2), and the sync's own hashes (a mismatch fails
the sync). Usage: two_jobs.py LAUNCH PORT train 2 train rollout 2 rollout -- python3 weight_sync.py FAMILY STAGE"""
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
import tessera  # noqa: E402
from decoder import Decoder  # noqa: E402
from checks import Checks  # noqa: E402
from hf_dir import write_hf_dir  # noqa: E402
from pytorch_oracle import train_averaged  # noqa: E402

FAMILY, STAGE = sys.argv[1], int(sys.argv[2])
CONFIG = {"model_type": FAMILY, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
          "rope_theta": 10000.0, "tie_word_embeddings": FAMILY == "qwen3", "eos_token_id": 63}
SYNC_AFTER, LR, WORLD = (3, 6), 3e-3, 2
PROMPTS = [[1, 5, 9, 2], [7, 7, 3], [60, 1]]
role, rank = os.environ["TESSERA_UCX_ROLE"], tessera.comm.get_rank()
check = Checks(f"{role} rank {rank}")
expect = check.expect


def model_of():
    torch.manual_seed(2024)
    return Decoder(CONFIG)


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(31 * step + r)
    ids = torch.randint(0, 64, (2, 9), generator=g)
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1))


def train_side():
    model = model_of()
    config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
              "zero_optimization": {"stage": STAGE, "stage3_param_persistence_threshold": 40},
              "tessera": {"transport": {"collective_timeout_ms": 60000}}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    for step in range(max(SYNC_AFTER)):
        engine.backward(loss_of(engine, step, rank))
        engine.step()
        if step + 1 in SYNC_AFTER:
            stats = engine.sync_weights(model_config=CONFIG, train_job="train", rollout_job="rollout") \
                if step + 1 == SYNC_AFTER[0] else engine.sync_weights()
            expect(stats["sync_ms"] > 0 and stats["verify_ms"] > 0, f"sync after step {step + 1}: {stats}")


def generate(rollout):
    return rollout.generate(PROMPTS, temperature=0, max_new_tokens=6, ignore_eos=True)


def rollout_side():
    rollout = tessera.rollout.RolloutEngine(config_path=write_config())
    sink = tessera.rollout.RolloutSink(rollout, train_job="train", rollout_job="rollout")
    synced = []
    for version in (1, 2):
        stats = sink.receive()
        expect(stats["version"] == version and rollout.weight_version == version, f"receive {version}: {stats}")
        synced.append(generate(rollout))
    del sink
    # The oracle: the same model and data, one process; its weights at each sync point loaded into the rollout.
    model = model_of()
    trainable = [p for p in model.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.01)
    done = 0
    for i, steps in enumerate(SYNC_AFTER):
        train_averaged(model, adamw, loss_of, steps - done, WORLD, first_step=done)
        done = steps
        rollout.load_weights(oracle_dir(model, f"round{i}"))
        expected = generate(rollout)
        expect(expected.tokens == synced[i].tokens, f"sync {i + 1}: tokens {synced[i].tokens} != {expected.tokens}")
        expect(expected.logprobs == synced[i].logprobs, f"sync {i + 1}: log-probs differ from the oracle's: "
                                                        f"{synced[i].logprobs} != {expected.logprobs}")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, 0] += 1e-3
    rollout.load_weights(oracle_dir(model, "perturbed"))
    expect(generate(rollout).logprobs != synced[-1].logprobs, "negative control: a perturbed oracle gave the same log-probs")
    shutil.rmtree(scratch())


def scratch():
    path = os.path.join("/tmp", f"tessera_py_sync_{FAMILY}_{STAGE}_{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    return path


def write_config():
    path = os.path.join(scratch(), "config")
    write_hf_dir(path, CONFIG, [])
    return os.path.join(path, "config.json")


def oracle_dir(model, name):
    path = os.path.join(scratch(), name)
    write_hf_dir(path, CONFIG, [(n, p) for n, p in model.named_parameters()])
    return path


(train_side if role == "train" else rollout_side)()
check.finish(f"python weight sync ok ({FAMILY}, stage {STAGE})")
