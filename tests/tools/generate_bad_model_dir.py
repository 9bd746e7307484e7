#!/usr/bin/env python3
"""Runs the generate example on a broken Hugging Face directory and passes when it ends quickly
with exit status 1 and one line on stderr naming the problem: never a signal (SIGABRT from an
uncaught LibTorch error), never a backtrace, never a hang.

  generate_bad_model_dir.py --case oversized_config GENERATE TINY_CONFIG_JSON
    config.json says vocab_size 2^40 (2^40 x 192 floats to allocate) while model.safetensors holds
    model.embed_tokens.weight of [256, 192]: the error names the tensor and both shapes.
  generate_bad_model_dir.py --case fifo_weights GENERATE TINY_CONFIG_JSON
    model.safetensors is a FIFO that nobody writes (open() would block forever): refused by name.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("--case", choices=["oversized_config", "fifo_weights"], required=True)
p.add_argument("--max-seconds", type=float, default=60)
p.add_argument("generate")
p.add_argument("tiny_config")
a = p.parse_args()

with open(a.tiny_config) as f:
    config = json.load(f)
vocab, hidden = config["vocab_size"], config["hidden_size"]

with tempfile.TemporaryDirectory(prefix="tessera_generate_bad_") as model_dir:
    weights = os.path.join(model_dir, "model.safetensors")
    if a.case == "oversized_config":
        config["vocab_size"] = 1 << 40
        # One F32 tensor of zeros, the first the model asks for: the header's shape is what counts.
        header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [vocab, hidden],
                                                            "data_offsets": [0, vocab * hidden * 4]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(weights, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(vocab * hidden * 4))
        expected = ["model.embed_tokens.weight", f"[{vocab}, {hidden}]", f"[{1 << 40}, {hidden}]"]
    else:
        os.mkfifo(weights)
        expected = [weights, "not a regular file (a FIFO)"]
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.monotonic()
    try:
        r = subprocess.run([a.generate, "--model-dir", model_dir, "--max-new-tokens", "1"], capture_output=True,
                           text=True, timeout=a.max_seconds, env=env)
    except subprocess.TimeoutExpired:
        print(f"FAIL: generate did not end within {a.max_seconds} s")
        sys.exit(1)
    elapsed = time.monotonic() - t0

print(f"exit status {r.returncode} after {elapsed:.1f} s\n--- stdout\n{r.stdout}--- stderr\n{r.stderr}---")
failures = []
if r.returncode != 1:
    failures.append(f"exit status {r.returncode}, expected 1" + (" (killed by a signal)" if r.returncode < 0 else ""))
lines = [line for line in r.stderr.splitlines() if line.strip()]
if len(lines) != 1:
    failures.append(f"{len(lines)} lines on stderr, expected one")
for text in ["terminate called", "Exception raised from", "frame #"]:
    if text in r.stderr:
        failures.append(f"stderr holds a backtrace ('{text}')")
for text in expected:
    if text not in r.stderr:
        failures.append(f"stderr lacks '{text}'")
for failure in failures:
    print("FAIL: " + failure)
sys.exit(1 if failures else 0)
