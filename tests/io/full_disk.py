#!/usr/bin/env python3
"""A full disk under a swap file, on a real size-limited tmpfs: the test program runs in a private
mount namespace (unshare -rm: a user namespace, so no root is needed where user namespaces are
allowed) whose TESSERA_FULL_DIR is a 1 MiB tmpfs, with the Catch2 tag given. Where the machine
allows no mount namespace, exits 77 (ctest: skipped), saying why.
Usage: full_disk.py PROGRAM TAG [ARGS...]"""
import os
import shlex
import subprocess
import sys
import tempfile

program, tag, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
mountpoint = tempfile.mkdtemp(prefix="tessera_full_")
try:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m none {shlex.quote(mountpoint)}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"full_disk: skipped: no private mount namespace here ({probe.stderr.strip()})")
        sys.exit(77)
    job = (f"mount -t tmpfs -o size=1m none {shlex.quote(mountpoint)} && exec "
           + " ".join(shlex.quote(a) for a in [program, tag, *rest]))
    env = dict(os.environ, TESSERA_FULL_DIR=mountpoint, OMP_NUM_THREADS="1")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", job], env=env, capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:])
    if r.returncode != 0:
        sys.exit("full_disk: the program failed:\n" + r.stderr[-4000:])
finally:
    os.rmdir(mountpoint)
