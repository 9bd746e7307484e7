#!/usr/bin/env python3
"""The Python binding's per-step overhead against the C++ engine on the same model, config and data: an MLP's
training step (forward, backward, step) timed at each ZeRO stage 0-3 on N ranks, C++ (binding_step) and Python
(this file with --worker) alternating, medians of --rounds. One JSON line per stage: ms per step of each and
ratio_to_cpp (python / cpp; goal <= 1.03 at stages 0-2, 1.05 at stage 3), and the same
of the runs' median step times (median_step_ratio_to_cpp: a scheduler hiccup moves a mean of 200 steps by percents);
the rounds alternate which side runs first (ABBA), and each round's pair ratio is listed with the median and
quartiles of them (this 2-core machine's noise moves single runs by 10-25%). Also the call overhead of a binding call
(engine.get_lr()) and the forward scope's cost (forward_binding_us: engine(x) against the module called directly, in
the same process), both in us.
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
    # The forward's share that is the binding's: engine(x) (its forward scope) against the same module called
    # directly, alternating on the same inputs in this process (graphs dropped, no backward). The rest of the
    # forward's difference to C++ is PyTorch's Python dispatch of the Python model.
    through, direct = [], []
    for i, (x, _) in enumerate(data[:args.steps]):
        for call, times in ((engine, through), (model, direct)) if i % 2 == 0 else ((model, direct), (engine, through)):
            t = time.perf_counter()
            call(x)
            times.append(time.perf_counter() - t)
    forward_binding_us = (statistics.median(through) - statistics.median(direct)) * 1e6
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
                      "forward_binding_us": forward_binding_us,
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
    return (slowest["ms_per_step"], median_step, max(l.get("call_us", 0) for l in lines), [slowest[k] for k in PHASES],
            max(l.get("forward_binding_us", 0) for l in lines))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build", nargs="?", default="build")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
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
        sides = {"cpp": [], "python": []}  # per round: (ms_per_step, median step, call us, phases)
        for r in range(args.rounds):
            # ABBA order (C++ first in even rounds, Python first in odd ones): a drift of the machine's speed
            # during the bench falls on both sides alike.
            for side in (("cpp", "python") if r % 2 == 0 else ("python", "cpp")):
                port += 1
                cmd = ([os.path.join(args.build, "bench", "python", "binding_step"), "--stage", str(stage)] if side == "cpp"
                       else ["/usr/bin/python3", os.path.abspath(__file__), "--worker", "--stage", str(stage)])
                sides[side].append(run(args.build, args.nproc, port, cmd + shape))
        cpp, py = sides["cpp"], sides["python"]
        c, pm = statistics.median(x[0] for x in cpp), statistics.median(x[0] for x in py)
        c_med, p_med = statistics.median(x[1] for x in cpp), statistics.median(x[1] for x in py)
        phases = {}
        for i, name in enumerate(PHASES):  # medians per phase: where the difference is
            phases["cpp_" + name] = round(statistics.median(x[3][i] for x in cpp), 4)
            phases["python_" + name] = round(statistics.median(x[3][i] for x in py), 4)
        # Each round's pair (adjacent runs), by median step time: their median and quartiles say how far the
        # machine's noise reaches.
        ratios = sorted(p[1] / c[1] for p, c in zip(py, cpp))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(json.dumps({"bench": "python_binding", "stage": stage, "world": args.nproc, "width": args.width,
                          "layers": args.layers, "batch": args.batch, "rounds": args.rounds, "steps": args.steps,
                          "cpp_ms_per_step": round(c, 4), "python_ms_per_step": round(pm, 4),
                          "ratio_to_cpp": round(pm / c, 4),
                          "cpp_median_step_ms": round(c_med, 4), "python_median_step_ms": round(p_med, 4),
                          "median_step_ratio_to_cpp": round(p_med / c_med, 4),
                          "round_ratio_median": round(statistics.median(ratios), 4),
                          "round_ratio_quartiles": [round(q, 4) for q in (quartiles[0], quartiles[2])],
                          "round_ratios": [round(p[1] / c[1], 3) for p, c in zip(py, cpp)],
                          "binding_call_us": round(statistics.median(x[2] for x in py), 3),
                          "forward_binding_us": round(statistics.median(x[4] for x in py), 2), **phases}),
              flush=True)

if __name__ == "__main__":
    main()
