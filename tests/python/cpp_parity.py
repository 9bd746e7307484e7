#!/usr/bin/env python3
"""The same training through the Python binding and through the C++ engine, bit for bit: an MLP (4 Linear(256, 256)
with ReLUs, torch.manual_seed(1234)), each (step, rank)'s batch from a generator seeded 10000 step + rank, the same
DeepSpeed config (AdamW lr 1e-3, weight decay 0.01), 30 steps on 2 ranks under tools/tessera-launch at ZeRO stages
0-3: build/bench/python/binding_step (C++: torch::nn::Sequential, tessera::initialize) and
bench/python/binding_overhead.py --worker (Python: torch.nn.Sequential, tessera.initialize) each save their trained
weights; they must equal each other and a single-process PyTorch oracle's (both ranks' gradients averaged,
torch.optim.AdamW) bit for bit. Negative control: the oracle with another lr differs.
Usage: cpp_parity.py BUILD_DIR PORT"""
import os
import subprocess
import sys
import tempfile

# The oracle computes with one thread, as the ranks run (OMP_NUM_THREADS=1): with two, BLAS may split
# a weight gradient's sum over the batch between threads and round differently (seen on a 2-core
# AVX-512 machine). The BLAS library reads the variable when it loads, so it is set before torch is.
if os.environ.get("OMP_NUM_THREADS") != "1":
    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, OMP_NUM_THREADS="1"))

import torch  # noqa: E402

from hf_dir import read_safetensors
from pytorch_oracle import train_averaged

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
build, port = sys.argv[1], int(sys.argv[2])
STEPS, WORLD, WIDTH, BATCH = 30, 2, 256, 16
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", flush=True)


def model_of():  # as binding_step and the worker build it
    torch.manual_seed(1234)
    layers = []
    for i in range(4):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def loss_of(model, step, r):
    g = torch.Generator().manual_seed(10000 * step + r)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    return torch.nn.functional.mse_loss(model(x), y)


def oracle(lr=1e-3):
    model = model_of()
    adamw = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    params = train_averaged(model, adamw, loss_of, STEPS, WORLD)
    return dict(zip([n for n, _ in model.named_parameters()], params))


def launch(cmd, stage):
    global port
    port += 2
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(build, "python"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tessera-launch"), "--nproc-per-node", str(WORLD),
                          "--master-port", str(port), "--grace-period", "2", "--"] + cmd +
                         ["--stage", str(stage), "--steps", str(STEPS), "--warmup", "0", "--width", str(WIDTH),
                          "--layers", "4", "--batch", str(BATCH)],
                         capture_output=True, text=True, env=env, timeout=240)
    expect(out.returncode == 0, f"{cmd[0]} at stage {stage}: exit {out.returncode}\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}")


expected = oracle()
perturbed = oracle(lr=1.001e-3)
expect(any(not torch.equal(expected[n], perturbed[n]) for n in expected), "negative control: a perturbed oracle equals")
with tempfile.TemporaryDirectory() as work:
    for stage in (0, 1, 2, 3):
        cpp_file, py_file = os.path.join(work, f"cpp{stage}.safetensors"), os.path.join(work, f"py{stage}.pt")
        launch([os.path.join(build, "bench", "python", "binding_step"), "--save", cpp_file], stage)
        launch(["/usr/bin/python3", os.path.join(ROOT, "bench", "python", "binding_overhead.py"), "--worker", "--save",
                py_file], stage)
        if not (os.path.exists(cpp_file) and os.path.exists(py_file)):
            expect(False, f"stage {stage}: a run saved nothing")
            continue
        cpp, py = read_safetensors(cpp_file), torch.load(py_file)
        expect(sorted(cpp) == sorted(expected) == sorted(py), f"stage {stage}: names {sorted(cpp)} / {sorted(py)}")
        for name, want in expected.items():
            if name in cpp and name in py:
                expect(torch.equal(py[name], cpp[name]), f"stage {stage}: '{name}': Python differs from C++ by "
                                                         f"{(py[name] - cpp[name]).abs().max().item()}")
                expect(torch.equal(py[name], want), f"stage {stage}: '{name}': Python differs from the oracle")
if failures:
    sys.exit(f"{len(failures)} failure(s)")
print("cpp parity ok", flush=True)
