"""What every part of the launcher shares: its name, its one way to fail, the store's ports and secret."""
import os
import signal
import sys

PROG = "tessera-launch"
SECRET_VAR = "TESSERA_STORE_SECRET"
# Variables a launch on other hosts carries to every rank (the store's secret never: see nodes.py).
FORWARDED_PREFIXES = ("TESSERA_", "UCX_", "NCCL_", "GLOO_", "OMP_", "PYTHONPATH", "LD_LIBRARY_PATH")


def die(message, status=2):
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.exit(status)


def port_variables(port):
    """tessera's store on `port`; MASTER_PORT one above, for torch.distributed's env:// store."""
    if not 1 <= port <= 65534:
        die(f"--master-port {port}: need a TCP port in 1..65534 (tessera's store on it, torch.distributed's above)")
    return {"TESSERA_STORE_PORT": str(port), "MASTER_PORT": str(port + 1)}


def store_secret():
    """The job's store secret: the caller's TESSERA_STORE_SECRET (two jobs that must meet are given
    the same one by whoever starts them), else a fresh random one, made once per launcher."""
    if not os.environ.get(SECRET_VAR):
        import secrets
        os.environ[SECRET_VAR] = secrets.token_hex(32)
    return os.environ[SECRET_VAR]


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def forwarded_names(environ):
    """The names of the variables a multi-host launch forwards, the secret excluded."""
    return sorted(k for k in environ if k.startswith(FORWARDED_PREFIXES) and k != SECRET_VAR)
