"""tessera.comm, DeepSpeed's deepspeed.comm basics: the launch environment's rank and world size (tessera-launch and
torchrun set RANK and WORLD_SIZE), process groups, and blocking collectives on Gloo communicators of their own
(separate from the engines'). torch.distributed is not needed. Each operation fails with tessera.TimeoutError naming
it and the missing rank after the collective timeout (TESSERA_COMM_TIMEOUT_MS, default 300 s; a group's own with
new_group(timeout=)), never hangs.

    tessera.comm.all_reduce(loss_sum)                 # in place, op="sum" | "avg" | "max" (or ReduceOp.SUM, ...)
    tessera.comm.all_gather_into_tensor(out, mine)    # out: world_size x mine, rank order
    tessera.comm.broadcast(t, src=0); tessera.comm.barrier()
    dp = tessera.comm.new_group([0, 2])               # every rank calls it, in the same order (torch.distributed's
    tessera.comm.all_reduce(t, group=dp)              # rule); src= and get_global_rank speak launched ranks

The communicator of all ranks is made by the first collective call or new_group, which are therefore collective
over every rank; a group's collectives involve its members only. A rank outside a group gets a ProcessGroup it is
no member of (get_rank(group) is -1) and an error naming it from the group's collectives. tessera.initialize(mpu=)
takes the data-parallel group from mpu.get_data_parallel_group().
"""
import enum
import os

_world = None
_world_group = None


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MAX = "max"


def _check_environment():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not os.environ.get("MASTER_ADDR"):
        raise RuntimeError("WORLD_SIZE is " + str(world) + " but MASTER_ADDR is not set: start the ranks with "
                           "tools/tessera-launch (or torchrun)")


class ProcessGroup:
    """Launched ranks that run collectives together (tessera.comm.new_group); group rank i is ranks[i]."""

    def __init__(self, ranks, communicator):
        self.ranks = tuple(ranks)
        self._communicator = communicator  # None on a rank outside the group

    def rank(self):
        """This rank's place in the group, -1 outside it."""
        return self._communicator.rank if self._communicator is not None else -1

    def size(self):
        return len(self.ranks)

    def __repr__(self):
        return f"tessera.comm.ProcessGroup(ranks={list(self.ranks)})"


class _WorldGroup(ProcessGroup):
    """Every launched rank; its communicator is made by the first collective on it."""

    def __init__(self, world_size):
        super().__init__(range(world_size), None)

    def rank(self):
        from . import _tessera
        return _tessera.launch_rank()

    def communicator(self):
        if self._communicator is None:
            self._communicator = _world_communicator()
        return self._communicator


def get_world_group():
    """The group of every launched rank (what group=None means)."""
    global _world_group
    if _world_group is None:
        from . import _tessera
        _world_group = _WorldGroup(_tessera.launch_world_size())
    return _world_group


def _group_of(group, what):
    from . import _tessera
    if group is None:
        return get_world_group()
    if not isinstance(group, ProcessGroup):
        raise _tessera.ConfigError(f"tessera.comm.{what}: group must be a tessera.comm.ProcessGroup (from new_group) "
                                   f"or None, not {type(group).__name__}")
    return group


def _communicator_of(group, what):
    """The group's communicator on a member; a tessera.ConfigError naming the rank and group elsewhere."""
    from . import _tessera
    g = _group_of(group, what)
    if isinstance(g, _WorldGroup):
        return g.communicator()
    if g._communicator is None:
        raise _tessera.ConfigError(f"tessera.comm.{what}: rank {_tessera.launch_rank()} is not a member of {g!r}")
    return g._communicator


def get_rank(group=None):
    """This rank in `group` (the launched rank for None); -1 outside the group."""
    return _group_of(group, "get_rank").rank()


def get_world_size(group=None):
    return _group_of(group, "get_world_size").size()


def get_global_rank(group, group_rank):
    """The launched rank of `group`'s member group_rank (torch.distributed.get_global_rank)."""
    from . import _tessera
    g = _group_of(group, "get_global_rank")
    if not 0 <= group_rank < g.size():
        raise _tessera.ConfigError(f"tessera.comm.get_global_rank: group rank {group_rank} is not in 0..{g.size() - 1} "
                                   f"of {g!r}")
    return g.ranks[group_rank]


def get_process_group_ranks(group):
    """The launched ranks of `group`, in group-rank order."""
    return list(_group_of(group, "get_process_group_ranks").ranks)


def new_group(ranks=None, timeout=None, backend=None):
    """A process group of the launched `ranks` (every rank for None), in that order: group rank i is ranks[i].
    Every launched rank calls it, with the same ranks, in the same order of groups (torch.distributed's rule); the
    members connect, the others get a group they are no member of. timeout: a datetime.timedelta or seconds for its
    collectives (default the communicator of all ranks' own). backend: None or "gloo" (tessera's CPU communicators)."""
    from . import _tessera
    if backend not in (None, "gloo"):
        raise _tessera.ConfigError(f"tessera.comm.new_group: backend {backend!r} is not supported (this build's "
                                   f"communicators are Gloo: None or 'gloo')")
    world = _tessera.launch_world_size()
    members = list(range(world)) if ranks is None else [r for r in ranks]
    for r in members:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world:
            raise _tessera.ConfigError(f"tessera.comm.new_group: rank {r!r} is not a launched rank 0..{world - 1}")
    if not members or len(set(members)) != len(members):
        raise _tessera.ConfigError(f"tessera.comm.new_group: ranks {members} must be distinct and not empty")
    timeout_ms = 0
    if timeout is not None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        if seconds <= 0:
            raise _tessera.ConfigError(f"tessera.comm.new_group: timeout must be > 0, got {timeout!r}")
        timeout_ms = max(1, int(seconds * 1000))
    world_comm = get_world_group().communicator()
    return ProcessGroup(members, world_comm.group(members, timeout_ms))


def data_parallel_group(what, mpu=None, group=None):
    """The data-parallel group of `what` (initialize, zero.Init): mpu.get_data_parallel_group() (DeepSpeed's mpu
    interface; model-parallel sizes must be 1), else `group`, else every launched rank; a ProcessGroup this rank is a
    member of."""
    from . import _tessera
    if mpu is not None:
        for name in ("get_model_parallel_world_size", "get_tensor_model_parallel_world_size",
                     "get_pipeline_model_parallel_world_size"):
            size = getattr(mpu, name)() if callable(getattr(mpu, name, None)) else 1
            if size != 1:
                raise _tessera.ConfigError(f"{what}: mpu.{name}() is {size}: tessera trains data parallel only so far "
                                           f"(tensor- and pipeline-parallel training are not implemented); give an "
                                           f"mpu whose model-parallel sizes are 1")
        if not callable(getattr(mpu, "get_data_parallel_group", None)):
            raise _tessera.ConfigError(f"{what}: mpu has no get_data_parallel_group() (DeepSpeed's mpu interface)")
        group, source = mpu.get_data_parallel_group(), "mpu.get_data_parallel_group()"
    else:
        source = "data_parallel_group"
    if group is None:
        return get_world_group()
    if not isinstance(group, ProcessGroup):
        raise _tessera.ConfigError(f"{what}: {source} must be a tessera.comm.ProcessGroup (tessera.comm.new_group), "
                                   f"not {type(group).__name__}")
    if group.rank() < 0:
        raise _tessera.ConfigError(f"{what}: rank {get_rank()} is not a member of the data-parallel group {group!r}")
    return group


def _world_communicator():
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
    _communicator_of(group, "barrier").barrier()


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """In place over every rank (op: ReduceOp or "sum" / "avg" / "max")."""
    if async_op:
        from . import _tessera
        raise _tessera.ConfigError("tessera.comm: async_op=True is not supported (the calls block)")
    _communicator_of(group, "all_reduce").all_reduce(_flat(tensor, "all_reduce's tensor"), op.value if isinstance(op, ReduceOp) else op)
    return tensor


def all_gather_into_tensor(output_tensor, input_tensor, group=None):
    """output_tensor (group size x input's elements, contiguous) gets every member's input in group-rank order."""
    _communicator_of(group, "all_gather_into_tensor").all_gather(_flat(input_tensor, "the input"), _flat(output_tensor, "the output"))
    return output_tensor


def all_gather(tensor_list, tensor, group=None):
    """tensor_list[r] gets group rank r's tensor (torch.distributed's signature)."""
    import torch
    out = torch.empty((len(tensor_list),) + tuple(tensor.shape), dtype=tensor.dtype)
    all_gather_into_tensor(out, tensor.contiguous(), group)
    for dst, src in zip(tensor_list, out):
        dst.copy_(src)
    return tensor_list


def broadcast(tensor, src, group=None):
    """From launched rank src (a member of `group`) to the group's members, in place."""
    from . import _tessera
    communicator, g = _communicator_of(group, "broadcast"), _group_of(group, "broadcast")
    if int(src) not in g.ranks:
        raise _tessera.ConfigError(f"tessera.comm.broadcast: src {src} is not a member of {g!r}")
    communicator.broadcast(_flat(tensor, "broadcast's tensor"), g.ranks.index(int(src)))
    return tensor
