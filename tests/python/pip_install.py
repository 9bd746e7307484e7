#!/usr/bin/env python3
"""The built package installs with pip and no network: a copy of BUILD/python installed by Debian's pip
(--no-index --no-build-isolation) into a fresh venv that sees the system's torch (--system-site-packages), then
imported from outside the repository by the venv's interpreter, which must find it in the venv, not in the build,
and train one step of a one-rank engine with it. Usage: pip_install.py BUILD_DIR"""
import os
import shutil
import subprocess
import sys
import tempfile

build = os.path.abspath(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    source = os.path.join(tmp, "source")
    shutil.copytree(os.path.join(build, "python"), source)  # pip builds in the tree it is given
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-build-isolation",
                    "--quiet", source], check=True)
    script = ("import torch, tessera\n"
              "print('installed at', tessera.__file__)\n"
              "m = torch.nn.Linear(3, 1)\n"
              "e, *_ = tessera.initialize(model=m, config={'train_micro_batch_size_per_gpu': 2,"
              " 'optimizer': {'type': 'SGD', 'params': {'lr': 0.5}}})\n"
              "before = m.weight.detach().clone()\n"
              "e.backward(e(torch.ones(2, 3)).sum()); e.step()\n"
              "assert torch.equal(m.weight.detach(), before - 0.5 * 2), 'one SGD step: wrong weights'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    r = subprocess.run([python, "-c", script], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    print(r.stdout + r.stderr)
    where = os.path.join(venv, "lib")
    if r.returncode != 0 or f"installed at {where}" not in r.stdout:
        sys.exit(f"pip_install: the installed package did not import from {where} and train")
print("pip install ok")
