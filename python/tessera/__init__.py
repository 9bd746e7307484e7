"""tessera for Python training scripts: `import tessera as deepspeed` is the one change a DeepSpeed script needs.

    engine, optimizer, _, lr_scheduler = tessera.initialize(model=model, config="ds_config.json")
    for batch in data:
        loss = engine(batch).mean()
        engine.backward(loss)
        engine.step()

The engine is tessera's C++ engine (ZeRO stages 0-3); the user's module is rewired
in place, so its own parameters are the engine's weights afterwards (views of its flat buffers).
Run ranks with `tools/tessera-launch --nproc-per-node N /usr/bin/python3 train.py`.
"""
import os
import sys


def _import_torch():
    try:
        import torch  # noqa: F401  (loads libtorch before the extension)
    except ImportError as e:
        raise ImportError(
            f"tessera needs Debian's python3-torch, the LibTorch 1.13 it was built against, and this interpreter "
            f"({sys.executable}) cannot import torch ({e}). Run it with /usr/bin/python3 (a pyenv or venv python3 "
            f"first on PATH does not see Debian's torch): PYTHONPATH=build/python /usr/bin/python3 ...") from None
    return torch


torch = _import_torch()

from . import _tessera  # noqa: E402


def _check_same_libtorch():
    built = ".".join(_tessera.torch_version.split(".")[:2])
    running = ".".join(torch.__version__.split(".")[:2])
    if built != running:
        raise ImportError(f"tessera was built against LibTorch {_tessera.torch_version} but this interpreter's torch is "
                          f"{torch.__version__} ({torch.__file__}); use the interpreter whose torch is the system LibTorch "
                          f"(Debian's /usr/bin/python3 with python3-torch)")
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libtorch_cpu.so" in line}
    real = {os.path.realpath(p) for p in paths}
    if len(real) > 1:
        raise ImportError(f"two LibTorch libraries are loaded ({', '.join(sorted(real))}): tessera and torch must share one")


_check_same_libtorch()

from ._tessera import CheckpointError, ConfigError, Error, MapError, PeerLostError, TimeoutError, TransportError  # noqa: E402,F401
from ._engine import TesseraEngine, initialize  # noqa: E402,F401
from . import comm  # noqa: E402,F401
from . import rollout  # noqa: E402,F401
from . import store  # noqa: E402,F401
from . import zero  # noqa: E402,F401
from . import utils  # noqa: E402,F401


def init_distributed(dist_backend=None, **kwargs):
    """DeepSpeed's init_distributed: tessera's communicators are made by initialize() from tessera-launch's (or
    torchrun's) environment; this only checks that environment. torch.distributed is not needed."""
    comm._check_environment()
