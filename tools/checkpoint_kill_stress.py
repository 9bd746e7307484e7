#!/usr/bin/env python3
"""kill -9 of a whole training job at random moments while it saves after every step, then a load
of the latest checkpoint and `tessera checkpoint verify` of every tag, --count times.

  python3 tools/checkpoint_kill_stress.py --build build --count 100 [--async] [--max-seconds 1200]

The job is engine_save_load_test's [.stress_save] on 2 ranks (a small GPT, stage 2, keep_last 2);
the check is [.stress_check] plus the verify command. A run stops early (and says so) once
--max-seconds have passed. Exit status 1 names the first kill after which nothing loaded."""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--build", default=os.path.join(here, "..", "build"))
p.add_argument("--count", type=int, default=100)
p.add_argument("--async", dest="async_save", action="store_true", help="asynchronous saves")
p.add_argument("--max-seconds", type=float, default=1200)
p.add_argument("--port", type=int, default=30400)
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()
launch = os.path.join(here, "tessera-launch")
program = os.path.join(args.build, "tests", "engine", "engine_save_load_test")
tessera = os.path.join(args.build, "tools", "tessera")
rng = random.Random(args.seed)
root = tempfile.mkdtemp(prefix="tessera_kill_stress_")
env = dict(os.environ, TESSERA_CKPT_DIR=root, TESSERA_STRESS_ASYNC="1" if args.async_save else "0", OMP_NUM_THREADS="1")
start = time.monotonic()
done = 0
try:
    for i in range(args.count):
        if time.monotonic() - start > args.max_seconds:
            print(f"stopped after {done} kills: --max-seconds {args.max_seconds:g} reached")
            break
        # The first save must have happened for there to be something to keep.
        job = subprocess.Popen([sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(args.port),
                                "--job", f"stress_{i}", "--grace-period", "2", "--", program, "[.stress_save]"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not os.path.exists(os.path.join(root, "latest")) and job.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.3, 2.5))
        # The launcher and every rank (each rank runs in a process group of its own): ranks first,
        # so the launcher cannot react; a rank left running would keep saving into the directory.
        subprocess.run(["pkill", "-KILL", "-P", str(job.pid)], check=False)
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        while subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True).returncode == 0:
            time.sleep(0.01)
        check = subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(args.port + 1),
                                "--job", f"stress_check_{i}", "--grace-period", "2", "--", program, "[.stress_check]"],
                               env=env, capture_output=True, text=True, timeout=300)
        verify = subprocess.run([tessera, "checkpoint", "verify", root], capture_output=True, text=True, timeout=300)
        if check.returncode != 0 or verify.returncode != 0:
            sys.stdout.write(check.stdout[-3000:] + check.stderr[-3000:] + verify.stdout + verify.stderr)
            sys.exit(f"kill {i + 1}: the checkpoint did not load or verify")
        loaded = [l for l in check.stdout.splitlines() if "loaded" in l]
        done += 1
        print(f"kill {done}: {loaded[-1].split('loaded ')[-1] if loaded else '?'} loads and verifies", flush=True)
    print(f"{done} kills, every one left a loadable, verified checkpoint ({time.monotonic() - start:.0f} s)")
finally:
    shutil.rmtree(root, ignore_errors=True)
