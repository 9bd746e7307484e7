"""tessera.comm: the launch environment's rank and world size (tessera-launch and torchrun set RANK and WORLD_SIZE)."""
import os


def _check_environment():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not os.environ.get("MASTER_ADDR"):
        raise RuntimeError("WORLD_SIZE is " + str(world) + " but MASTER_ADDR is not set: start the ranks with "
                           "tools/tessera-launch (or torchrun)")


def get_rank():
    from . import _tessera
    return _tessera.launch_rank()


def get_world_size():
    from . import _tessera
    return _tessera.launch_world_size()
