"""tessera.initialize and the engine it returns, in DeepSpeed's shape (deepspeed.initialize, DeepSpeedEngine)."""
import atexit
import collections
import json
import os
import weakref

import torch

from . import _tessera, comm, zero
from ._optimizer import client_optimizer, parameter_name
from ._scheduler import ClientScheduler, EngineScheduler
from ._zero3 import install_unit_hooks
from .utils import leaf_module_names


WeightInfo = collections.namedtuple("WeightInfo", ["name", "dtype", "shape"])
StoredMap = collections.namedtuple("StoredMap", ["kind", "buffer", "map"])
StorageMaps = collections.namedtuple("StorageMaps", ["maps", "buffers"])


def _named_parameters(model):
    """The module's parameters in named_parameters() order, each tensor once (tied weights under the first name)."""
    return [(name, p) for name, p in model.named_parameters()]


def _groups(model, model_parameters):
    """DeepSpeed's model_parameters (None, an iterable of tensors, or of dicts with "params") as names and options."""
    if model_parameters is None:
        return [], []
    names_of = {id(p): name for name, p in model.named_parameters()}
    items = list(model_parameters)  # a generator is fine: read once
    if not items:
        raise _tessera.ConfigError("initialize: model_parameters is empty")
    if not isinstance(items[0], dict):
        items = [{"params": items}]
    group_names, group_options = [], []
    for g, group in enumerate(items):
        if not isinstance(group, dict) or "params" not in group:
            raise _tessera.ConfigError(f"initialize: model_parameters[{g}] must be a tensor or a dict with 'params'")
        names = []
        for p in group["params"]:
            name = parameter_name(p, names_of, f"model_parameters group {g}")
            if not p.is_leaf:
                raise _tessera.ConfigError(f"initialize: model_parameters group {g}: '{name}' is not a leaf")
            names.append(name)
        options = {}
        for key, value in group.items():
            if key == "params":
                continue
            if key == "betas":
                options["beta1"], options["beta2"] = float(value[0]), float(value[1])
            elif key in ("lr", "weight_decay", "eps", "momentum"):
                options[key] = float(value)
            else:
                raise _tessera.ConfigError(f"initialize: model_parameters group {g}: option '{key}' is not supported")
        group_names.append(names)
        group_options.append(options)
    return group_names, group_options


def _config(args, config, config_params):
    config = config if config is not None else config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        launched = _tessera.launch_config()  # tessera-launch --config_file's, when the script gives none
        if launched is not None:
            return launched[0], False
    if config is None:
        raise _tessera.ConfigError("initialize: no config (pass config= a dict or the path of a JSON/TOML file, "
                                   "or start the script with tessera-launch --config_file accelerate.yaml)")
    if isinstance(config, (str, os.PathLike)):
        return os.fspath(config), True
    if isinstance(config, dict):
        return json.dumps(config), False
    raise _tessera.ConfigError(f"initialize: config must be a dict or a path, not {type(config).__name__}")


class TesseraEngine:
    """DeepSpeedEngine's calls on tessera's C++ engine. `module` is the user's module (its parameters are the
    engine's weights)."""

    def __init__(self, module, engine, data_parallel_group):
        self.module = module
        self._engine = engine
        self.data_parallel_group = data_parallel_group  # a tessera.comm.ProcessGroup (DeepSpeed's attribute)
        self._hooks, self._sender, self._client_scheduler = [], None, None
        _live_engines.add(self)

    def destroy(self):
        """Releases the C++ engine now (DeepSpeed's destroy()): its hooks leave the module, the weight sender closes,
        and the engine's threads end, in that order. Also run for every live engine when the interpreter exits, so
        no C++ thread outlives Python's finalisation. The engine cannot be used afterwards."""
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._sender, self._client_scheduler = [], None, None
        optimizer, scheduler = getattr(self, "optimizer", None), getattr(self, "lr_scheduler", None)
        holders = [self, optimizer, scheduler if isinstance(scheduler, EngineScheduler) else None]
        holders += optimizer.param_groups if optimizer else []
        for holder in holders:
            if holder is not None:
                holder._engine = None

    def __call__(self, *args, **kwargs):
        with self._engine.forward_scope():
            return self.module(*args, **kwargs)

    forward = __call__

    def backward(self, loss):
        if not isinstance(loss, torch.Tensor):
            raise _tessera.Error(f"backward: the loss must be a tensor, not {type(loss).__name__}")
        self._engine.backward(loss)
        return loss

    def step(self, lr_kwargs=None):
        boundary, skipped = self._engine.is_gradient_accumulation_boundary(), self._engine.skipped_steps
        self._engine.step()
        if self._client_scheduler is not None and boundary and self._engine.skipped_steps == skipped:
            self._client_scheduler.step(lr_kwargs)  # after an update, as DeepSpeed steps a client scheduler

    def zero_grad(self):
        self._engine.zero_grad()

    def no_sync(self):
        return self._engine.no_sync()

    def scale(self, loss):
        """The loss as backward() differentiates it (over the accumulation steps, times the fp16 loss scale), for
        scripts that call loss.backward() themselves: engine.scale(loss).backward(); engine.step()."""
        if not isinstance(loss, torch.Tensor):
            raise _tessera.Error(f"scale: the loss must be a tensor, not {type(loss).__name__}")
        return self._engine.scale(loss)

    def coalesce_grad_reduction(self):
        """Several backward() calls whose gradients are reduced once, when the block ends."""
        return self._engine.coalesce_grad_reduction()

    def storage_maps(self):
        """What this rank stores, as affine maps (StoredMap(kind, buffer, map) with the map as a dict, see
        actors/engine/storage_maps.h), and this rank's flat buffers by key. Call between steps. A piece's offset
        counts elements from its buffer's first element; a buffer may be a view into a larger storage, so read it
        with buffer.as_strided(shape, strides, buffer.storage_offset() + offset)."""
        maps, buffers = self._engine.storage_maps()
        return StorageMaps([StoredMap(kind, buffer, json.loads(text)) for kind, buffer, text in maps], buffers)

    def is_gradient_accumulation_boundary(self):
        return self._engine.is_gradient_accumulation_boundary()

    def get_lr(self):
        return self._engine.get_lr()

    def get_global_grad_norm(self):
        norm = self._engine.get_global_grad_norm()
        return None if norm < 0 else norm

    @property
    def global_steps(self):
        return self._engine.global_steps

    @property
    def skipped_steps(self):
        return self._engine.skipped_steps

    def train_micro_batch_size_per_gpu(self):
        return self._engine.train_micro_batch_size_per_gpu()

    def gradient_accumulation_steps(self):
        return self._engine.gradient_accumulation_steps()

    def zero_optimization_stage(self):
        return self._engine.zero_optimization_stage()

    def train(self, mode=True):
        self.module.train(mode)
        (self._engine.train if mode else self._engine.eval)()
        return self

    def eval(self):
        return self.train(False)

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        self._engine.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag),
                                     json.dumps(client_state or {}), save_latest)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """Returns (load_path, client_state) as DeepSpeed does."""
        path, client_state = self._engine.load_checkpoint(os.fspath(load_dir), "" if tag is None else str(tag),
                                                          load_optimizer_states, load_lr_scheduler_states,
                                                          load_module_only)
        return path, json.loads(client_state)

    def save_16bit_model(self, save_dir, save_filename="model.safetensors", exclude_frozen_parameters=False,
                         max_shard_bytes=None):
        if save_filename != "model.safetensors":
            raise _tessera.CheckpointError(f"save_16bit_model: tessera writes Hugging Face's model.safetensors (sharded "
                                           f"with an index above max_shard_bytes), not '{save_filename}'")
        limit = _tessera.default_max_shard_bytes if max_shard_bytes is None else int(max_shard_bytes)
        self._engine.save_16bit_model(os.fspath(save_dir), exclude_frozen_parameters, limit)
        return True

    # DeepSpeed's OffloadStateTypeEnum names (and tessera's own) for offload_states(include=...).
    _STATE_NAMES = {"optim_states": "optimizer_states", "hp_params": "master_weights", "lp_params": "parameters",
                    "lp_grads": "gradients", "contiguous_grad_buffer": "gradients", "optimizer_states": "optimizer_states",
                    "master_weights": "master_weights", "parameters": "parameters", "gradients": "gradients"}

    def offload_states(self, include=None, device="cpu", pin_memory=True, non_blocking=False):
        """DeepSpeed's offload_states (colocated RL, between training and generation): moves the named states
        (DeepSpeed's OffloadStateTypeEnum members or names: optim_states, hp_params, lp_params, lp_grads,
        contiguous_grad_buffer; every state when None) to host memory and frees the device's copy. The module's
        weights have no memory meanwhile (lp_params): run nothing through it until reload_states(). Only device
        "cpu"; the copies are done when it returns whatever non_blocking says. Returns {state: bytes moved}."""
        if str(getattr(device, "value", device)) != "cpu":
            raise _tessera.ConfigError(f"offload_states: device {device!r}: only 'cpu' (host memory) is supported")
        names = []
        for item in include or []:
            key = str(getattr(item, "value", getattr(item, "name", item)))
            if key not in self._STATE_NAMES:
                raise _tessera.ConfigError(f"offload_states: unknown state {item!r} (one of "
                                           f"{', '.join(sorted(self._STATE_NAMES))})")
            if self._STATE_NAMES[key] not in names:
                names.append(self._STATE_NAMES[key])
        return self._engine.offload_states(names, bool(pin_memory))

    def reload_states(self, non_blocking=False):
        """Brings back what offload_states moved, bit for bit; returns {state: bytes moved}."""
        return self._engine.reload_states()

    def empty_partition_cache(self):
        """ZeRO-3: releases every gathered unit not held by a gathered-parameters scope. Stages 0-2: nothing."""
        self._engine.empty_partition_cache()

    def weight_metadata(self):
        """[WeightInfo(name, dtype, shape)] of every trainable weight, full shapes, in the engine's order, read from
        its storage maps: nothing is gathered or materialised (what a vLLM/SGLang-style receiver is told first)."""
        return [WeightInfo(name, dtype, tuple(shape)) for name, dtype, shape in self._engine.weight_metadata()]

    def named_weights(self):
        """Yields (name, tensor) for every trainable weight, whole (verl's per-tensor export). Stages 0-2: the
        module's parameters (views of the flat buffers, no copy). ZeRO-3: one unit gathered at a time; a tensor is
        valid until the generator moves on. Collective: every rank iterates it to the end (or closes it on every
        rank); copy a tensor to keep it."""
        params = dict(self.module.named_parameters())
        for names in self._engine.gather_groups():
            with self._engine.gathered_parameters(names, -1):
                for name in names:
                    yield name, params[name].detach()

    def sync_weights(self, model_config=None, train_job=None, rollout_job=None, **options):
        """Pushes the weights into a rollout job (tessera.rollout.WeightSender; collective over both jobs). The first
        call names the model's config.json and the jobs and connects; later calls take no arguments."""
        if self._sender is None:
            if model_config is None or train_job is None or rollout_job is None:
                raise _tessera.ConfigError("sync_weights: the first call needs model_config, train_job and rollout_job")
            from .rollout import WeightSender
            self._sender = WeightSender(self, model_config, train_job, rollout_job, **options)
        elif model_config is not None or options:
            raise _tessera.ConfigError("sync_weights: already connected; later calls take no arguments")
        return self._sender.sync()

    def wait_for_checkpoint(self):
        self._engine.wait_for_checkpoint()

    def gathered_parameters(self, params=None, modifier_rank=None):
        """The parameters (all when None) whole on every rank until the scope ends; with modifier_rank, that rank's
        changes are written back (DeepSpeed's zero.GatheredParameters). Collective."""
        names = []
        if params is not None:
            if isinstance(params, torch.Tensor):
                params = [params]
            by_id = {id(p): n for n, p in self.module.named_parameters()}
            for p in params:
                if id(p) not in by_id:
                    raise _tessera.ConfigError("gathered_parameters: a tensor that is not a parameter of the model")
                names.append(by_id[id(p)])
        if modifier_rank is not None and int(modifier_rank) not in self.data_parallel_group.ranks:
            raise _tessera.ConfigError(f"gathered_parameters: modifier_rank {modifier_rank} is not a member of the "
                                       f"engine's data-parallel group {self.data_parallel_group!r}")
        # DeepSpeed's modifier_rank is a launched rank; the C++ engine's, its place in the data-parallel group.
        group_rank = -1 if modifier_rank is None else self.data_parallel_group.ranks.index(int(modifier_rank))
        return self._engine.gathered_parameters(names, group_rank)


_live_engines = weakref.WeakSet()


@atexit.register
def _destroy_live_engines():
    for engine in list(_live_engines):
        engine.destroy()


class _ParamGroup(dict):
    """One entry of optimizer.param_groups: reading "lr" asks the engine; setting it sets that group's lr."""

    def __init__(self, engine, index, params):
        super().__init__(params=params)
        self._engine, self._index = engine, index

    def __getitem__(self, key):
        if key == "lr":
            return self._engine.get_lr()[self._index]
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if key == "lr":
            return self._engine.set_lr(float(value), self._index)
        return super().__setitem__(key, value)


class EngineOptimizer(torch.optim.Optimizer):
    """What initialize returns as the optimizer (DeepSpeed's ZeRO optimizer): the engine steps it; scripts read and
    set param_groups' lr and call zero_grad(). A torch.optim.Optimizer, so that torch's lr schedulers can be built
    on it (DeepSpeed's lr_scheduler factory); its state is the engine's (storage_maps())."""

    def __init__(self, engine, groups):  # not Optimizer.__init__: the engine owns the parameters and states
        self._engine = engine
        self.defaults, self.state = {}, {}
        self.param_groups = [_ParamGroup(engine, i, params) for i, params in enumerate(groups)]

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    def step(self, closure=None):
        raise _tessera.Error("optimizer.step(): the engine steps the optimizer; call engine.step()")


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               mpu=None, dist_init_required=None, collate_fn=None, config=None, config_params=None):
    """deepspeed.initialize: returns (engine, optimizer, training_dataloader, lr_scheduler). Collective: every rank
    calls it. The optimizer is the config's `optimizer` section or a client torch.optim optimizer (or a callable
    building one from model_parameters; _optimizer.py); the scheduler comes from the config's `scheduler` section
    or is the client's lr_scheduler (a torch scheduler, or a callable building one on the optimizer; _scheduler.py);
    with training_data (a torch Dataset) the dataloader is DeepSpeed's: this rank's share through a
    DistributedSampler (shuffled, seed 0), micro-batches of train_micro_batch_size_per_gpu, collate_fn. With mpu
    (DeepSpeed's interface: get_data_parallel_group() a tessera.comm.ProcessGroup, model-parallel sizes 1) the
    engine is data parallel over that group only (collective over its members), else over every launched rank."""
    if not isinstance(model, torch.nn.Module):
        raise _tessera.ConfigError("initialize: model must be a torch.nn.Module")
    group = comm.data_parallel_group("initialize", mpu=mpu)
    text, is_path = _config(args, config, config_params)
    client_kind, client_groups, client_step = None, [], None
    if optimizer is not None:
        # As DeepSpeed: with a client optimizer, model_parameters only feeds an optimizer factory.
        client_kind, client_groups, client_step, optimizer = client_optimizer(model, optimizer, model_parameters)
        group_names, group_options = [], []
    else:
        group_names, group_options = _groups(model, model_parameters)
    # Leaf modules by name: the engine's module tree is built from parameter names, so a leaf without parameters
    # of its own subtree is no unit and is left out.
    params = [name for name, _ in model.named_parameters()]
    config_classes = _tessera.config_leaf_classes(text, is_path)
    leaves = [n for n in leaf_module_names(model, config_classes) if any(p.startswith(n + ".") for p in params)]
    world = None if isinstance(group, comm._WorldGroup) else group._communicator
    engine = TesseraEngine(model, _tessera.initialize(_named_parameters(model), text, is_path, group_names, group_options,
                                                      leaves, client_kind, client_groups, client_step, world), group)
    if engine.zero_optimization_stage() == 3:
        engine._hooks = install_unit_hooks(model, engine._engine)
    zero._register_engine(engine)
    by_name = dict(model.named_parameters())
    group_names = group_names or [names for names, _ in client_groups]
    groups = [[by_name[n] for n in names] for names in group_names] or [[p for p in model.parameters() if p.requires_grad]]
    engine_optimizer = EngineOptimizer(engine._engine, groups)
    scheduler = EngineScheduler(engine._engine) if engine._engine.has_scheduler() else None
    if lr_scheduler is not None:
        if scheduler is not None:
            raise _tessera.ConfigError("initialize: lr_scheduler= and the config's `scheduler` section were both given; "
                                       "keep one")
        engine._client_scheduler = ClientScheduler(engine._engine, lr_scheduler,
                                                   optimizer if optimizer is not None else engine_optimizer)
        scheduler = engine._client_scheduler.scheduler
    engine.optimizer, engine.lr_scheduler, engine.client_optimizer = engine_optimizer, scheduler, optimizer
    engine.training_dataloader = None if training_data is None else _dataloader(engine, training_data, collate_fn)
    return engine, engine_optimizer, engine.training_dataloader, scheduler


def _dataloader(engine, dataset, collate_fn):
    """DeepSpeed's training dataloader: each data-parallel rank reads its own share of `dataset` (DistributedSampler
    with DeepSpeed's defaults: shuffled, seed 0, the last incomplete round padded), train_micro_batch_size_per_gpu
    samples per batch; call loader.sampler.set_epoch(epoch) for another order per epoch."""
    from torch.utils.data import DataLoader, DistributedSampler
    if not isinstance(dataset, torch.utils.data.Dataset):
        raise _tessera.ConfigError(f"initialize: training_data must be a torch.utils.data.Dataset, not "
                                   f"{type(dataset).__name__}")
    sampler = DistributedSampler(dataset, num_replicas=engine._engine.world_size, rank=engine._engine.rank)
    return DataLoader(dataset, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler,
                      collate_fn=collate_fn)
