#!/usr/bin/env python3
"""Saves a checkpoint at one (data-parallel size, stage) and loads it at others, each a separate
tessera-launch job: fresh processes, another world size, another stage.
Usage: save_load_layouts.py LAUNCH PROGRAM PORT DTYPE SAVE(np:stage) LOAD(np:stage)...
Passes when every job exits 0 within its time limit."""
import os
import shutil
import subprocess
import sys
import tempfile

launch, program, port, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
layouts = [tuple(int(x) for x in arg.split(":")) for arg in sys.argv[5:]]
root = tempfile.mkdtemp(prefix="tessera_layouts_")
try:
    for i, (nproc, stage) in enumerate(layouts):
        tag = "[.layout_save]" if i == 0 else "[.layout_load]"
        env = dict(os.environ, TESSERA_CKPT_DIR=root, TESSERA_CKPT_STAGE=str(stage), TESSERA_CKPT_DTYPE=dtype,
                   OMP_NUM_THREADS="1")
        print(f"--- {tag} at {nproc} ranks, stage {stage}, {dtype}", flush=True)
        job = subprocess.run([sys.executable, launch, "--nproc-per-node", str(nproc), "--master-port", str(port + i),
                              "--job", f"layouts_{dtype}_{i}", "--grace-period", "2", "--", program, tag],
                             env=env, timeout=300)
        if job.returncode != 0:
            sys.exit(f"{tag} at {nproc} ranks, stage {stage} failed with status {job.returncode}")
finally:
    shutil.rmtree(root, ignore_errors=True)
