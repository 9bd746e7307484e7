"""tessera.comm, DeepSpeed's deepspeed.comm basics: the launch environment's rank and world size (tessera-launch and
torchrun set RANK and WORLD_SIZE), and blocking collectives over every launched rank on a Gloo communicator of
their own (made by the first collective call, which is therefore collective too; separate from the engines').
torch.distributed is not needed. Each operation fails with tessera.TimeoutError naming it and the missing rank
after the collective timeout (TESSERA_COMM_TIMEOUT_MS, default 300 s), never hangs.

    tessera.comm.all_reduce(loss_sum)                 # in place, op="sum" | "avg" | "max" (or ReduceOp.SUM, ...)
    tessera.comm.all_gather_into_tensor(out, mine)    # out: world_size x mine, rank order
    tessera.comm.broadcast(t, src=0); tessera.comm.barrier()
"""
import enum
import os

_world = None


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"


def _check_environment():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not os.environ.get("MASTER_ADDR"):
        raise RuntimeError("WORLD_SIZE is " + str(world) + " but MASTER_ADDR is not set: start the ranks with "
                           "tools/tessera-launch (or torchrun)")


def get_rank(group=None):
    from . import _tessera
    _no_group(group)
    return _tessera.launch_rank()


def get_world_size(group=None):
    from . import _tessera
    _no_group(group)
    return _tessera.launch_world_size()


def _no_group(group):
    if group is not None:
        from . import _tessera
        raise _tessera.ConfigError("tessera.comm: process groups are not supported; every call spans all launched ranks")


def _communicator():
    global _world
    if _world is None:
        from . import _tessera
        _check_environment()
        _world = _tessera.world_communicator(int(os.environ.get("TESSERA_COMM_TIMEOUT_MS", "300000")))
    return _world


def _flat(tensor, what):
    from . import _tessera
    import torch
    if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
        raise _tessera.ConfigError(f"tessera.comm: {what} must be a contiguous tensor")
    return tensor.view(-1)


def barrier(group=None):
    _no_group(group)
    _communicator().barrier()


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """In place over every rank (op: ReduceOp or "sum" / "avg" / "max")."""
    _no_group(group)
    if async_op:
        from . import _tessera
        raise _tessera.ConfigError("tessera.comm: async_op=True is not supported (the calls block)")
    _communicator().all_reduce(_flat(tensor, "all_reduce's tensor"), op.value if isinstance(op, ReduceOp) else op)
    return tensor


def all_gather_into_tensor(output_tensor, input_tensor, group=None):
    """output_tensor (world_size x input's elements, contiguous) gets every rank's input in rank order."""
    _no_group(group)
    _communicator().all_gather(_flat(input_tensor, "the input"), _flat(output_tensor, "the output"))
    return output_tensor


def all_gather(tensor_list, tensor, group=None):
    """tensor_list[r] gets rank r's tensor (torch.distributed's signature)."""
    import torch
    out = torch.empty((len(tensor_list),) + tuple(tensor.shape), dtype=tensor.dtype)
    all_gather_into_tensor(out, tensor.contiguous(), group)
    for dst, src in zip(tensor_list, out):
        dst.copy_(src)
    return tensor_list


def broadcast(tensor, src, group=None):
    _no_group(group)
    _communicator().broadcast(_flat(tensor, "broadcast's tensor"), int(src))
    return tensor
