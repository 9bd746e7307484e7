#!/usr/bin/env python3
"""Preemption: 2 ranks train until SIGTERM reaches tessera-launch (after step 3); the launcher
forwards it, every rank saves at its next step boundary and exits 0 (the launcher reports the
interruption, 143); a fresh launch loads the checkpoint and trains on.
Usage: save_load_sigterm.py LAUNCH PROGRAM PORT"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

launch, program, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
root = tempfile.mkdtemp(prefix="tessera_sigterm_")
try:
    env = dict(os.environ, TESSERA_CKPT_DIR=root, OMP_NUM_THREADS="1")
    job = subprocess.Popen([sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(port), "--job",
                            "sigterm_save", "--grace-period", "30", "--", program, "[.sigterm]"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(root, ".ready")) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if job.poll() is not None:
        sys.exit("the training job ended before the SIGTERM:\n" + job.stdout.read())
    sent = time.monotonic()
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=120)
    print(out[-3000:])
    print(f"--- the job ended {time.monotonic() - sent:.2f} s after SIGTERM, status {job.returncode}")
    if job.returncode != 128 + signal.SIGTERM or "all ended" not in out:
        sys.exit("expected every rank to end cleanly after the forwarded SIGTERM")
    if "SIGTERM: saved checkpoint" not in out:
        sys.exit("no checkpoint was saved on SIGTERM")
    check = subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(port + 1), "--job",
                            "sigterm_check", "--grace-period", "2", "--", program, "[.sigterm_check]"],
                           env=env, capture_output=True, text=True, timeout=300)
    if check.returncode != 0:
        sys.exit("the checkpoint left by SIGTERM did not load:\n" + check.stdout[-3000:] + check.stderr[-3000:])
    print("saved on SIGTERM and resumed")
finally:
    shutil.rmtree(root, ignore_errors=True)
