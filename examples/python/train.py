#!/usr/bin/env python3
"""A plain DeepSpeed training script: a Qwen3-style decoder (examples/grpo/policy's config, bytes as tokens) learns
next-byte prediction on a text file. The one line that makes it a tessera script is the import:

    import tessera as deepspeed          # was: import deepspeed

Run (every rank):  tools/tessera-launch --nproc-per-node 2 /usr/bin/python3 examples/python/train.py \\
                       --deepspeed_config examples/python/ds_config.json --steps 30 --save-dir out/python_train
(PYTHONPATH=build/python, or the package installed). Without --corpus it reads the repository's README.md."""
import argparse
import json
import os
import sys

import torch

import tessera as deepspeed

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from decoder import Decoder, initialise  # noqa: E402


class ByteWindows(torch.utils.data.Dataset):
    """A file's bytes cut into consecutive windows of length + 1 tokens (inputs and shifted targets)."""

    def __init__(self, path, length):
        with open(path, "rb") as f:
            self.tokens = torch.tensor(list(f.read()), dtype=torch.long)
        self.length = length

    def __len__(self):
        return (len(self.tokens) - 1) // (self.length + 1)

    def __getitem__(self, i):
        return self.tokens[i * (self.length + 1):(i + 1) * (self.length + 1)]


def model_and_data(args):
    with open(os.path.join(args.model_config, "config.json")) as f:
        config = json.load(f)
    model = Decoder(config)
    initialise(model, args.seed)
    return model, ByteWindows(args.corpus, args.context), config["vocab_size"]


def loss_of(model, batch, vocab):
    logits = model(batch[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))


def parse_args(argv=None):
    root = os.path.dirname(os.path.dirname(HERE))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--model-config", default=os.path.join(root, "examples", "grpo", "policy"))
    ap.add_argument("--corpus", default=os.path.join(root, "README.md"))
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dir", default="")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    deepspeed.init_distributed()
    model, data, vocab = model_and_data(args)
    engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                        training_data=data)
    step = 0
    while step < args.steps:
        for batch in loader:
            loss = loss_of(engine, batch, vocab)
            engine.backward(loss)
            engine.step()
            step += 1
            if deepspeed.comm.get_rank() == 0 and (step % 10 == 0 or step == 1):
                print(f"step {step:4d} | loss {loss.item():.4f} | lr {engine.get_lr()[0]:.2e}", flush=True)
            if step == args.steps:
                break
    if args.save_dir:
        engine.save_16bit_model(args.save_dir)  # the weights in their training dtype, a Hugging Face directory
        if deepspeed.comm.get_rank() == 0:
            print(f"saved {args.save_dir}/model.safetensors", flush=True)


if __name__ == "__main__":
    main()
