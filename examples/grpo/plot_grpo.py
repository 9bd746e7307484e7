#!/usr/bin/env python3
"""Draws the GRPO example's curve (the CSV the training job writes) with matplotlib: mean reward,
KL and sync time per step on three panels that share the step axis.

Usage: plot_grpo.py CSV PNG
matplotlib comes from Debian (python3-matplotlib, tools/install-deps.sh), which installs it for
/usr/bin/python3; run_grpo.py finds an interpreter that has it (plotting_python) and skips the plot,
saying so, when none does: the training result never depends on it.
"""
import os
import subprocess
import sys

SYSTEM_PYTHON = "/usr/bin/python3"  # where Debian's python3-matplotlib lives


def plotting_python():
    """This interpreter if it imports matplotlib, else Debian's if that one does, else None."""
    try:
        import matplotlib  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    if os.path.exists(SYSTEM_PYTHON) and os.path.realpath(SYSTEM_PYTHON) != os.path.realpath(sys.executable):
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"], capture_output=True)
        if probe.returncode == 0:
            return SYSTEM_PYTHON
    return None


def read_columns(csv_path):
    lines = [line.strip().split(",") for line in open(csv_path) if line.strip()]
    header, rows = lines[0], lines[1:]
    return {name: [float(r[i]) for r in rows] for i, name in enumerate(header)}


def draw(csv_path, png_path):
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    c = read_columns(csv_path)
    step = c["step"]
    fig, (reward, kl, sync) = plt.subplots(3, 1, sharex=True, figsize=(8, 7.5), constrained_layout=True)
    fig.suptitle(f"GRPO, reverse digits: {len(step)} steps ({os.path.basename(csv_path)})")
    reward.plot(step, c["reward"], color="tab:red", label="mean reward")
    reward.axhline(0.8, color="gray", linestyle=":", linewidth=1, label="aim: 0.8")
    reward.set_ylim(0, 1.02)
    reward.set_ylabel("reward (fraction right)")
    kl.plot(step, c["kl"], color="tab:green", label="KL(policy || reference)")
    kl.set_ylabel("KL")
    sync.plot(step, c["sync_ms"], color="tab:blue", label="weight sync")
    if "pause_ms" in c:
        sync.plot(step, c["pause_ms"], color="tab:orange", label="generation paused")
    sync.set_ylabel("time per step (ms)")
    sync.set_xlabel("step")
    for ax in (reward, kl, sync):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    draw(sys.argv[1], sys.argv[2])
