#!/usr/bin/env python3
"""A full disk during a save, on a real size-limited tmpfs: the whole 2-rank job runs in a private
mount namespace (unshare -rm: a user namespace, so no root is needed where user namespaces are
allowed) whose checkpoint directory is a 16 MiB tmpfs; the [.tmpfs_full] case fills it and checks
that the save fails cleanly. Where the machine allows no mount namespace, exits 77 (ctest: skipped),
saying why; the RLIMIT_FSIZE case of the suite covers a full disk there.
Usage: save_load_full_disk.py LAUNCH PROGRAM PORT"""
import os
import shlex
import subprocess
import sys
import tempfile

launch, program, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
mountpoint = tempfile.mkdtemp(prefix="tessera_tmpfs_")
try:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m none {shlex.quote(mountpoint)}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"save_load_full_disk: skipped: no private mount namespace here ({probe.stderr.strip()})")
        sys.exit(77)
    job = (f"mount -t tmpfs -o size=16m none {shlex.quote(mountpoint)} && "
           f"exec {shlex.quote(sys.executable)} {shlex.quote(launch)} --nproc-per-node 2 --master-port {port} "
           f"--job tmpfs_full --grace-period 2 -- {shlex.quote(program)} '[.tmpfs_full]'")
    env = dict(os.environ, TESSERA_CKPT_DIR=mountpoint, OMP_NUM_THREADS="1")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", job], env=env, capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:])
    if r.returncode != 0:
        sys.exit("save_load_full_disk: the job failed:\n" + r.stderr[-4000:])
    print("save_load_full_disk: a save onto a full tmpfs committed nothing; the last checkpoint loaded; saves went on")
finally:
    os.rmdir(mountpoint)
