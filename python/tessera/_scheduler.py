"""The lr schedulers initialize returns: the engine's own (the config's `scheduler` section, stepped in C++), or a
client's (DeepSpeed's lr_scheduler=: a torch lr scheduler built on the client optimizer, or a callable building
one on the optimizer initialize returns). The engine steps a client scheduler after every update that was not
skipped, as DeepSpeed does, then gives the engine each group's lr from the scheduler's optimizer."""
from . import _tessera


class EngineScheduler:
    """What initialize returns as the lr scheduler when the config has a `scheduler` section: the engine steps it
    after every update that was not skipped, as DeepSpeed does; step() here is a no-op for scripts that call it."""

    def __init__(self, engine):
        self._engine = engine

    def get_lr(self):
        return self._engine.get_lr()

    def get_last_lr(self):
        return self._engine.get_last_lr()

    @property
    def last_batch_iteration(self):
        return self._engine.last_batch_iteration()

    def step(self, *args, **kwargs):
        pass


class ClientScheduler:
    """Drives a client's torch lr scheduler from the engine's updates."""

    def __init__(self, engine, lr_scheduler, optimizer):
        if not hasattr(lr_scheduler, "step") and callable(lr_scheduler):
            lr_scheduler = lr_scheduler(optimizer)  # DeepSpeed's factory form
        if not hasattr(lr_scheduler, "step") or not hasattr(lr_scheduler, "optimizer"):
            raise _tessera.ConfigError(f"initialize: lr_scheduler must be a torch lr scheduler or a callable that "
                                       f"builds one on the optimizer, not {type(lr_scheduler).__name__}")
        groups = lr_scheduler.optimizer.param_groups
        if len(groups) != engine.num_param_groups():
            raise _tessera.ConfigError(f"initialize: lr_scheduler's optimizer has {len(groups)} param groups, the "
                                       f"engine {engine.num_param_groups()}")
        self._engine, self.scheduler = engine, lr_scheduler
        self._push()  # the lr the scheduler set when it was built

    def step(self, lr_kwargs=None):
        optimizer = self.scheduler.optimizer
        if hasattr(optimizer, "_step_count"):
            optimizer._step_count += 1  # what torch counts when the optimizer's own step() runs
        self.scheduler.step(**(lr_kwargs or {}))
        self._push()

    def _push(self):
        for g, group in enumerate(self.scheduler.optimizer.param_groups):
            self._engine.set_lr(float(group["lr"]), g)
