#!/usr/bin/env python3
"""An engine's teardown from Python is over when destroy() returns: its actors have ended and let go of everything
they held. Before, destroy() only asked them to end, and they released their tensors and a client optimizer's
Python step() later on their own threads, taking the GIL; at interpreter exit that raced Python's finalisation, where
a thread taking the GIL is ended ("terminate called without an active exception": about 1 run in 10 of the Python
GRPO job at ZeRO-3). Checked at stages 1 and 3 on 2 ranks with a client RMSprop (run by its own step() on the
optimizer-shard's thread, which alone then holds it): right after destroy(), with no Python code run in between
(the switch interval is 5 ms, so an actor thread waiting for the GIL cannot have taken it yet), a weak reference to
the optimizer is dead. And an engine left alive at exit is torn down cleanly by the interpreter's exit: each rank runs a child
interpreter (a job of its own on another store port) that trains a stage-3 engine and exits without destroy(),
three times; each must exit 0 with nothing about terminate on its stderr.
Usage: tessera-launch --nproc-per-node 2 /usr/bin/python3 teardown.py"""
import gc
import os
import subprocess
import sys
import weakref

import torch

import tessera
from checks import Checks
from mlp_task import model_of, rows

rank = tessera.comm.get_rank()
checks = Checks(f"rank {rank}")
sys.setswitchinterval(0.05)  # a waiting thread gets the GIL only after 50 ms: the old race loses every time


def config(stage):
    return {"train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "tessera": {"transport": {"collective_timeout_ms": 30000}}}


def trained_engine(stage):
    model = model_of()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    engine, _, _, _ = tessera.initialize(model=model, optimizer=optimizer, config=config(stage))
    for step in range(3):
        x, y = rows(step, rank, 4)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    return engine, weakref.ref(optimizer)


if sys.argv[1:] == ["--child"]:
    kept, _ = trained_engine(3)  # torn down by the interpreter's exit
    print(f"rank {rank}: child trained", flush=True)
    sys.exit(0)

child_env = {k: v for k, v in os.environ.items() if k != "TESSERA_HEARTBEAT_FD"}
child_env["TESSERA_STORE_PORT"] = str(int(os.environ["TESSERA_STORE_PORT"]) + 2)
child_env["TESSERA_JOB"] = os.environ.get("TESSERA_JOB", "teardown") + "_child"
for run in range(3):
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=child_env, capture_output=True,
                           text=True, timeout=120)
    checks.expect(child.returncode == 0 and "child trained" in child.stdout and "terminate" not in child.stderr,
                  f"exit with a live engine, run {run}: exit status {child.returncode}, stderr: {child.stderr[-2000:]}")

for stage in (1, 3):
    engine, optimizer = trained_engine(stage)
    gc.collect()
    checks.expect(optimizer() is not None, f"stage {stage}: the engine does not hold its client optimizer (test broken)")
    engine.destroy()
    del engine
    gc.disable()  # nothing collected by luck: only the actors' own release can free it
    released = optimizer() is None
    gc.enable()
    checks.expect(released, f"stage {stage}: destroy() returned while an actor still held the client optimizer")
checks.finish("teardown ok")
