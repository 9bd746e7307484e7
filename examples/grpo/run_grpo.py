#!/usr/bin/env python3
"""Runs the GRPO example: a training job (DP 2, ZeRO-2) and a rollout job (TP 2), both under
tessera-launch on this machine, meeting in the training job's store (one shared secret) and over
UCX. Ends both on Ctrl-C or when either fails. Afterwards draws the curve (reward, sync time) as a
PNG with a small writer of its own (zlib + struct; no plotting package needed).

Usage: examples/grpo/run_grpo.py [--build DIR] [--train-ranks N] [--rollout-ranks N] [--port P]
                                 [--out DIR] [--sync-mode in_place|double_buffered] [--delta]
                                 [-- extra grpo arguments, e.g. --steps 40]
Every extra argument goes to both jobs (the weight-sync handshake refuses options they disagree on);
`-- --config configs/autotp.toml` takes the weight sync's settings from that file's [tessera.rollout].
"""
import argparse
import os
import signal
import struct
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def start(launch, program, n, port, job, peer, role, extra, secret, server, out):
    env = dict(os.environ, TESSERA_STORE_SECRET=secret)
    if not server:
        env["TESSERA_STORE_SERVER"] = "0"  # join the training job's store
    cmd = [sys.executable, launch, "--nproc-per-node", str(n), "--master-port", str(port), "--job", job,
           "--grace-period", "3", "--", program, "--role", role, "--peer-job", peer,
           "--csv", os.path.join(out, "grpo.csv")] + extra
    return subprocess.Popen(cmd, env=env, start_new_session=True)


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


def png(path, width, height, pixels):
    """pixels: list of rows of (r, g, b)."""
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(csv_path, png_path):
    rows = [l.strip().split(",") for l in open(csv_path)][1:]
    if not rows:
        return
    reward = [float(r[1]) for r in rows]
    sync = [float(r[6]) for r in rows]
    W, H, M = 640, 360, 30
    img = [[(255, 255, 255)] * W for _ in range(H)]
    for x in range(M, W - M):
        img[H - M][x] = (0, 0, 0)
    for y in range(M, H - M + 1):
        img[y][M] = (0, 0, 0)
    for frac in (0.2, 0.8):  # guide lines at reward 0.2 and 0.8
        y = int(H - M - frac * (H - 2 * M))
        for x in range(M, W - M, 4):
            img[y][x] = (180, 180, 180)
    def draw(values, top, color):
        n = len(values)
        for i in range(n):
            x = M + int(i * (W - 2 * M - 1) / max(1, n - 1))
            y = int(H - M - min(1.0, values[i] / top) * (H - 2 * M))
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    if 0 <= y + dy < H and 0 <= x + dx < W:
                        img[y + dy][x + dx] = color
    draw(reward, 1.0, (200, 30, 30))                 # red: mean reward (0..1)
    draw(sync, max(sync) * 1.1 or 1, (30, 90, 200))  # blue: sync ms (0..max)
    png(png_path, W, H, img)


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
    secret = os.urandom(16).hex()
    os.chdir(ROOT)
    train = start(launch, program, args.train_ranks, args.port, "grpo_train", "grpo_rollout", "train", extra, secret,
                  True, args.out)
    time.sleep(0.5)
    rollout = start(launch, program, args.rollout_ranks, args.port, "grpo_rollout", "grpo_train", "rollout", extra,
                    secret, False, args.out)
    status = 1
    try:
        while True:
            t, r = train.poll(), rollout.poll()
            if t is not None and t != 0 or r is not None and r != 0:
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
    csv = os.path.join(args.out, "grpo.csv")
    if status == 0 and os.path.exists(csv):
        plot(csv, os.path.join(args.out, "grpo.png"))
        print(f"run_grpo: curve in {csv}, plot (red: reward, blue: sync ms) in {os.path.join(args.out, 'grpo.png')}")
    return status


if __name__ == "__main__":
    sys.exit(main())
