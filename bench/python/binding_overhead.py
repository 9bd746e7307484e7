#!/usr/bin/env python3
"""The Python binding's per-step overhead against the C++ engine on the same model, config and data: an MLP's
training step (forward, backward, step) timed at each ZeRO stage 0-3 on N ranks, C++ (binding_step) and Python
(this file with --worker) alternating, medians of --rounds. One JSON line per stage: ms per step of each and
ratio_to_cpp (python / cpp; goal <= 1.03 at stages 0-2, 1.05 at stage 3), and the same
of the runs' median step times (median_step_ratio_to_cpp: a scheduler hiccup moves a mean of 200 steps by percents), plus the call overhead of a binding call (engine.get_lr()) in us.
    python3 bench/python/binding_overhead.py build [--nproc 2]
Run with any python3: the workers run under Debian's /usr/bin/python3 (the binding's interpreter)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(args):
    import torch
    import tessera
    rank = tessera.comm.get_rank()
    torch.manual_seed(1234)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Linear(args.width, args.width))
        if i + 1 < args.layers:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    config = {"train_micro_batch_size_per_gpu": args.batch, "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
              "zero_optimization": {"stage": args.stage}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    data = []
    for s in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(10000 * s + rank)
        data.append((torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g)))
    phase_ms = [0.0, 0.0, 0.0]  # forward (with the loss), backward, step
    step_ms = []  # each timed step: their median is not moved by a scheduler hiccup
    for s, (x, y) in enumerate(data):
        t0 = time.perf_counter()
        if s == args.warmup:
            start = t0
        loss = torch.nn.functional.mse_loss(engine(x), y)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        if s >= args.warmup:
            t3 = time.perf_counter()
            for i, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3))):
                phase_ms[i] += (b - a) * 1000
            step_ms.append((t3 - t0) * 1000)
    ms = (time.perf_counter() - start) * 1000 / args.steps
    calls = 20000
    t = time.perf_counter()
    for _ in range(calls):
        engine.get_lr()
    call_us = (time.perf_counter() - t) * 1e6 / calls
    if args.save:  # the trained weights, whole (tests/python/cpp_parity.py)
        with engine.gathered_parameters():
            weights = {name: p.detach().clone() for name, p in model.named_parameters()}
        if rank == 0:
            torch.save(weights, args.save)
    print(json.dumps({"impl": "python", "rank": rank, "stage": args.stage, "ms_per_step": ms,
                      "median_step_ms": statistics.median(step_ms), "call_us": call_us,
                      **{k: v / args.steps for k, v in zip(PHASES, phase_ms)}}))


PHASES = ("forward_ms", "backward_ms", "step_ms")


def run(build, nproc, port, cmd):
    launch = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "tessera-launch")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(build, "python"))
    out = subprocess.run([sys.executable, launch, "--nproc-per-node", str(nproc), "--master-port", str(port), "--"] + cmd,
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    lines = [json.loads(l.split(": ", 1)[1] if l.startswith("[rank") else l) for l in out.stdout.splitlines() if "ms_per_step" in l]
    slowest = max(lines, key=lambda l: l["ms_per_step"])  # a step ends when the slowest rank's does
    median_step = max(l["median_step_ms"] for l in lines)
    return slowest["ms_per_step"], median_step, max(l.get("call_us", 0) for l in lines), [slowest[k] for k in PHASES]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build", nargs="?", default="build")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--save", default="", help="with --worker: rank 0 saves the trained weights here (torch.save)")
    for name, default in (("width", 256), ("layers", 4), ("steps", 200), ("warmup", 10), ("stage", 2), ("batch", 16)):
        p.add_argument("--" + name, type=int, default=default)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    shape = ["--width", str(args.width), "--layers", str(args.layers), "--steps", str(args.steps), "--warmup",
             str(args.warmup), "--batch", str(args.batch)]
    port = 30290
    for stage in (0, 1, 2, 3):
        cpp, py, cpp_med, py_med, calls, cpp_phases, py_phases = [], [], [], [], [], [], []
        for r in range(args.rounds):
            port += 1
            c, c_med, _, c_phases = run(args.build, args.nproc, port, [os.path.join(args.build, "bench", "python", "binding_step"),
                                                                "--stage", str(stage)] + shape)
            port += 1
            pm, p_med, call, p_phases = run(args.build, args.nproc, port, ["/usr/bin/python3", os.path.abspath(__file__),
                                                                    "--worker", "--stage", str(stage)] + shape)
            cpp.append(c), py.append(pm), calls.append(call), cpp_phases.append(c_phases), py_phases.append(p_phases)
            cpp_med.append(c_med), py_med.append(p_med)
        c, pm = statistics.median(cpp), statistics.median(py)
        phases = {}
        for i, name in enumerate(PHASES):  # medians per phase: where the difference is
            phases["cpp_" + name] = round(statistics.median(p[i] for p in cpp_phases), 4)
            phases["python_" + name] = round(statistics.median(p[i] for p in py_phases), 4)
        print(json.dumps({"bench": "python_binding", "stage": stage, "world": args.nproc, "width": args.width,
                          "layers": args.layers, "cpp_ms_per_step": round(c, 4), "python_ms_per_step": round(pm, 4),
                          "ratio_to_cpp": round(pm / c, 4),
                          "cpp_median_step_ms": round(statistics.median(cpp_med), 4),
                          "python_median_step_ms": round(statistics.median(py_med), 4),
                          "median_step_ratio_to_cpp": round(statistics.median(py_med) / statistics.median(cpp_med), 4),
                          "round_ratios": [round(p / c, 3) for p, c in zip(py_med, cpp_med)], "binding_call_us": round(statistics.median(calls), 3), **phases}),
              flush=True)


if __name__ == "__main__":
    main()
