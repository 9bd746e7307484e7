#!/usr/bin/env python3
"""kill -9 of one rank at each point of a save (synchronous and asynchronous), then a fresh launch checks that the last
checkpoint is intact (engine_save_load_test [.kill_save] / [.kill_check]).
Usage: save_load_kill.py LAUNCH PROGRAM PORT"""
import os
import shutil
import subprocess
import sys
import tempfile

launch, program, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
# (point, rank killed): every rank writes its file; rank 0 alone writes the manifest and commits.
POINTS = [("rank_file_written", 1), ("rank_file_written", 0), ("manifest_written", 0), ("committed", 0),
          ("latest_written", 0)]
# Each point in a synchronous save and in an asynchronous one (killed on the writer's thread).
CASES = [(point, rank, mode) for mode in ("sync", "async") for point, rank in POINTS]
CASES.append(("snapshot_begins", 1, "async"))  # before the writer has copied anything
failures = []
for i, (point, rank, mode) in enumerate(CASES):
    root = tempfile.mkdtemp(prefix="tessera_kill_")
    try:
        env = dict(os.environ, TESSERA_CKPT_DIR=root, TESSERA_KILL_POINT=point, TESSERA_KILL_RANK=str(rank),
                   TESSERA_KILL_ASYNC="1" if mode == "async" else "0", OMP_NUM_THREADS="1")
        for phase, tag in (("kill", "[.kill_save]"), ("check", "[.kill_check]")):
            job = subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port",
                                  str(port + 2 * i + (phase == "check")), "--job", f"kill_{i}_{phase}",
                                  "--grace-period", "2", "--", program, tag],
                                 env=env, timeout=300, capture_output=True, text=True)
            print(f"--- {mode} {point} (rank {rank} killed): {phase} exited {job.returncode}", flush=True)
            if phase == "kill" and job.returncode == 0:
                failures.append(f"{mode} {point}: the killed save's job exited 0")
            if phase == "check" and job.returncode != 0:
                sys.stdout.write(job.stdout[-4000:] + job.stderr[-4000:])
                failures.append(f"{mode} {point}: the check after the kill failed")
    finally:
        shutil.rmtree(root, ignore_errors=True)
if failures:
    sys.exit("\n".join(failures))
print(f"all {len(CASES)} kill points left a loadable checkpoint")
