#!/usr/bin/env python3
"""`tessera checkpoint inspect|verify` on a real checkpoint (saved by 2 ranks at stage 2 through
engine_save_load_test [.layout_save]): inspect shows the layout and files, verify passes, and after
one flipped byte verify fails naming the file and the buffer.
Usage: checkpoint_cli.py LAUNCH SAVE_PROGRAM TESSERA PORT"""
import os
import shutil
import subprocess
import sys
import tempfile

launch, program, tessera, port = sys.argv[1:5]
root = tempfile.mkdtemp(prefix="tessera_ckpt_cli_")


def run(*args, expect=0):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=300)
    if p.returncode != expect:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def expect_in(text, *needles):
    for n in needles:
        if n not in text:
            sys.exit(f"missing {n!r} in:\n{text}")


try:
    env = dict(os.environ, TESSERA_CKPT_DIR=root, TESSERA_CKPT_STAGE="2", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port", port, "--job", "ckpt_cli",
                    "--grace-period", "2", "--", program, "[.layout_save]"], env=env, check=True, timeout=300,
                   capture_output=True)
    tag = os.path.join(root, "global_step3")
    expect_in(run(tessera, "checkpoint", "inspect", root), "checkpoint 'global_step3': data-parallel 2, stage 2",
              "steps: global 3", "rank0.safetensors (rank 0", "rank1.safetensors (rank 1", "exp_avg/0 f32")
    expect_in(run(tessera, "checkpoint", "verify", root), tag + ": ok (")
    with open(os.path.join(tag, "rank1.safetensors"), "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0x01]))
    expect_in(run(tessera, "checkpoint", "verify", tag, expect=1), "rank1.safetensors: buffer 'exp_avg/0'",
              "do not match their hash")
    expect_in(run(tessera, "checkpoint", "verify", os.path.join(root, "nothing"), expect=1), "no committed checkpoint")
    print("checkpoint inspect/verify: ok")
finally:
    shutil.rmtree(root, ignore_errors=True)
