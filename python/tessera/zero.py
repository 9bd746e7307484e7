"""deepspeed.zero for tessera: Init (partitioned construction) and GatheredParameters.

    with tessera.zero.Init():                      # every rank: each module's parameters are cut as it is built
        model = MyModel()                          # this rank keeps 1/W of each; the whole is freed
    engine, *_ = tessera.initialize(model=model, config=stage3_config)

    with tessera.zero.GatheredParameters(model.lm_head.weight, modifier_rank=0):
        ...                                        # whole on every rank; rank 0's changes are kept

Init cuts a module's own parameters when its outermost __init__ returns (so a subclass may still set its weights
in its own __init__), through the C++ engine's partitioned construction (core/zero/partitioned_construction.h):
values made in constructors are those of plain construction with the same seed. A cut parameter keeps its shape
and has no memory until initialize, which takes such a model at ZeRO stage 3 only (other stages refuse it by name).
Parameters are built in fp32 (the engine's bf16/fp16 settings convert them at initialize)."""
import functools
import weakref

import torch

from . import _tessera, comm

_engines_of_parameters = {}  # id(parameter) -> weakref to its TesseraEngine (set by initialize)


def _register_engine(engine):
    ref = weakref.ref(engine)
    for p in engine.module.parameters():
        _engines_of_parameters[id(p)] = (ref, weakref.ref(p))


def _engine_of(p):
    entry = _engines_of_parameters.get(id(p))
    if entry is None or entry[1]() is not p:
        return None
    return entry[0]()


def _all_subclasses(cls):
    out, todo = {cls}, [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def init_flag():
    """zero3_init_flag of the Accelerate file tessera-launch --config_file read (False without one): a script
    builds its model inside `tessera.zero.Init(enabled=tessera.zero.init_flag())`, as Accelerate's users do
    through accelerator.state.deepspeed_plugin.zero3_init_flag."""
    return _tessera.launch_zero3_init()


class Init:
    """Partitioned construction over the data-parallel group (DeepSpeed's zero.Init: mpu's, data_parallel_group,
    else every launched rank). `module=` cuts an already built
    module's parameters now. remote_device other than None/"cpu" (offload) and a dtype other than fp32 are refused."""

    def __init__(self, module=None, data_parallel_group=None, remote_device=None, pin_memory=False,
                 config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None, **kwargs):
        # Cut for the data-parallel group the engine will have (initialize's mpu=, or data_parallel_group=).
        group = comm.data_parallel_group("zero.Init", mpu=mpu, group=data_parallel_group)
        if remote_device not in (None, "cpu", "none"):
            raise _tessera.ConfigError(f"zero.Init: remote_device '{remote_device}': offload is not implemented yet")
        if dtype not in (None, torch.float32):
            raise _tessera.ConfigError(f"zero.Init: dtype {dtype}: partitioned construction builds fp32 parameters "
                                       f"(the config's bf16/fp16 converts them at initialize)")
        self.enabled = enabled
        self.world, self.rank = group.size(), group.rank()
        self._depth, self._originals, self._had_init_subclass = {}, [], None
        if module is not None and enabled:
            for m in module.modules():
                self._cut(m)

    def _cut(self, module):
        for p in module._parameters.values():
            if p is not None:
                _tessera.partition_parameter(p, self.world, self.rank)

    def _wrap(self, cls):
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_tessera_init", False):
            return

        @functools.wraps(original)
        def init(module, *args, **kwargs):
            key = id(module)
            depth = self._depth.get(key, 0)
            self._depth[key] = depth + 1
            try:
                original(module, *args, **kwargs)
            finally:
                if depth:
                    self._depth[key] = depth
                else:
                    del self._depth[key]
            if depth == 0:  # the outermost __init__ of this object: its own parameters are final
                self._cut(module)

        init._tessera_init = True
        cls.__init__ = init
        self._originals.append((cls, original))

    def __enter__(self):
        if not self.enabled:
            return self
        for cls in _all_subclasses(torch.nn.Module):
            self._wrap(cls)
        self._had_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        scope = self

        def init_subclass(cls, **kwargs):  # classes defined inside the scope
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            scope._wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, original in reversed(self._originals):
            cls.__init__ = original
        self._originals = []
        if self._had_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._had_init_subclass
        return False


class GatheredParameters:
    """DeepSpeed's zero.GatheredParameters: the parameters whole on every rank inside the scope (collective); with
    modifier_rank, that rank's changes are written back. Parameters of no ZeRO-3 engine: nothing to do, as in
    DeepSpeed; a parameter cut by zero.Init whose engine does not exist yet is an error."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        params = [params] if isinstance(params, torch.Tensor) else [p for p in params if p is not None]
        self._scope = None
        if not enabled or not params:
            return
        engines = {id(e): e for e in (_engine_of(p) for p in params) if e is not None}
        if len(engines) > 1:
            raise _tessera.ConfigError("zero.GatheredParameters: the parameters belong to different engines")
        if not engines:
            cut = [p for p in params if _tessera.is_partitioned(p)]
            if cut:
                raise _tessera.ConfigError(f"zero.GatheredParameters: {len(cut)} parameter(s) were cut by zero.Init and "
                                           f"belong to no engine yet (call tessera.initialize first)")
            return
        self._scope = next(iter(engines.values())).gathered_parameters(params, modifier_rank)

    def __enter__(self):
        if self._scope is not None:
            self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        if self._scope is not None:
            self._scope.__exit__(*exc)
        return False
