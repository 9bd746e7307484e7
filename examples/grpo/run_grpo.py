#!/usr/bin/env python3
"""Runs the GRPO example: a training job (DP 2, ZeRO-2) and a rollout job (TP 2), both under
tessera-launch on this machine, meeting in the training job's store (one shared secret) and over
UCX. Ends both on Ctrl-C or when either fails. Each job's whole output goes to the terminal and to
OUT/grpo_train.log and OUT/grpo_rollout.log; when a job fails, the failing rank's last lines are
printed again at the end. Afterwards draws the curve (reward, KL, sync time) with matplotlib
(plot_grpo.py; skipped, saying so, where matplotlib is missing).

Usage: examples/grpo/run_grpo.py [--build DIR] [--train-ranks N] [--rollout-ranks N] [--port P]
                                 [--out DIR] [--sync-mode in_place|double_buffered] [--delta]
                                 [-- extra grpo arguments, e.g. --steps 40]
Every extra argument goes to both jobs (the weight-sync handshake refuses options they disagree on);
`-- --config configs/autotp.toml` takes the weight sync's settings from that file's [tessera.rollout].
"""
import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import plot_grpo  # noqa: E402

LAST_LINES = 20  # of the failing rank, printed when a job fails


def start(launch, program, n, port, job, peer, role, extra, secret, server, out):
    """Starts one job under tessera-launch; its output goes to the terminal and to OUT/JOB.log."""
    env = dict(os.environ, TESSERA_STORE_SECRET=secret, PYTHONUNBUFFERED="1")  # the launcher's lines as they come
    if not server:
        env["TESSERA_STORE_SERVER"] = "0"  # join the training job's store
    if isinstance(program, list):  # the Python training side: the package beside the build
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [program[-1], env.get("PYTHONPATH")]))
        program = program[:-1]
    cmd = [sys.executable, launch, "--nproc-per-node", str(n), "--master-port", str(port), "--job", job,
           "--grace-period", "3", "--"] + (program if isinstance(program, list) else [program]) + ["--role", role, "--peer-job", peer,
           "--csv", os.path.join(out, "grpo.csv")] + extra
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.log_path = os.path.join(out, job + ".log")
    proc.tee = threading.Thread(target=tee, args=(proc.stdout, proc.log_path), daemon=True)
    proc.tee.start()
    return proc


def tee(pipe, log_path):
    with open(log_path, "wb") as log:
        for line in iter(pipe.readline, b""):
            log.write(line)
            log.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()


def report_failure(name, proc):
    """The job's log and its failing rank's last lines (the rank tessera-launch names; else the log's end)."""
    proc.tee.join(timeout=10)
    lines = open(proc.log_path, errors="replace").read().splitlines()
    failed = [m.group(1) for l in lines for m in [re.match(r"tessera-launch: rank (\d+) ", l)] if m]
    print(f"run_grpo: the {name} job failed (status {proc.returncode}); its whole output is in {proc.log_path}",
          file=sys.stderr)
    if failed:
        rank = failed[0]
        tail = collections.deque((l for l in lines if l.startswith(f"[rank{rank}]")), maxlen=LAST_LINES)
        print(f"run_grpo: rank {rank} of the {name} job, its last {len(tail)} lines:", file=sys.stderr)
    else:
        tail = lines[-LAST_LINES:]
        print(f"run_grpo: the {name} job's last {len(tail)} lines:", file=sys.stderr)
    for l in tail:
        print("    " + l, file=sys.stderr)


def plot(csv_path, png_path):
    """True when the plot was drawn. The training result never depends on it."""
    python = plot_grpo.plotting_python()
    if python is None:
        print("run_grpo: no plot: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return False
    r = subprocess.run([python, os.path.join(HERE, "plot_grpo.py"), csv_path, png_path])
    if r.returncode != 0:
        print(f"run_grpo: no plot: plot_grpo.py exited {r.returncode}", file=sys.stderr)
    return r.returncode == 0


def stop(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--train-ranks", type=int, default=2)
    ap.add_argument("--rollout-ranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=29850)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "grpo"))
    ap.add_argument("--sync-mode", choices=["in_place", "double_buffered"], default=None,
                    help="in_place: generation waits while the weights are written; double_buffered: they land in "
                         "a standby copy, swapped in at the next generate() (both jobs get the same)")
    ap.add_argument("--delta", action="store_true", help="delta syncs: only the changed elements travel (both jobs)")
    ap.add_argument("--python-train", action="store_true",
                    help="the training side in Python (examples/python/grpo_train.py on the tessera package in "
                         "BUILD/python, run by /usr/bin/python3), against the same C++ rollout job")
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    if args.sync_mode:
        extra += ["--sync-mode", args.sync_mode]
    if args.delta:
        extra += ["--delta"]
    os.makedirs(args.out, exist_ok=True)
    launch = os.path.join(ROOT, "tools", "tessera-launch")
    program = os.path.join(args.build, "examples", "grpo", "grpo")
    if not os.path.exists(program):
        sys.exit(f"run_grpo: {program} not found: build first (cmake --build {args.build})")
    train_program = program
    if args.python_train:
        train_program = ["/usr/bin/python3", os.path.join(ROOT, "examples", "python", "grpo_train.py"),
                         os.path.join(args.build, "python")]
    secret = os.urandom(16).hex()
    os.chdir(ROOT)
    train = start(launch, train_program, args.train_ranks, args.port, "grpo_train", "grpo_rollout", "train", extra, secret,
                  True, args.out)
    time.sleep(0.5)
    rollout = start(launch, program, args.rollout_ranks, args.port, "grpo_rollout", "grpo_train", "rollout", extra,
                    secret, False, args.out)
    status, failed = 1, []
    try:
        while True:
            t, r = train.poll(), rollout.poll()
            failed = [(name, p) for name, p, code in (("training", train, t), ("rollout", rollout, r))
                      if code is not None and code != 0]
            if failed:
                print(f"run_grpo: a job failed (training {t}, rollout {r}); ending the other", file=sys.stderr)
                break
            if t == 0 and r == 0:
                status = 0
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("run_grpo: interrupted; ending both jobs", file=sys.stderr)
    finally:
        stop(train)
        stop(rollout)
        for proc in (train, rollout):
            proc.tee.join(timeout=10)
    for name, proc in failed:
        report_failure(name, proc)
    csv = os.path.join(args.out, "grpo.csv")
    if status == 0 and os.path.exists(csv):
        png = os.path.join(args.out, "grpo.png")
        if os.path.exists(png):
            os.remove(png)  # never leave an earlier run's plot beside this run's curve
        drawn = plot(csv, png)
        print(f"run_grpo: curve in {csv}" + (f", plot (reward, KL, sync ms by step) in {png}" if drawn else "") +
              f"; logs in {train.log_path}, {rollout.log_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
