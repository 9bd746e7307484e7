"""verl's engine backend on tessera: the calls verl's trainers make of an engine (verl/workers/engine/base.py,
BaseEngine, as its DeepSpeed backend implements them), on tessera.initialize's engine.

    engine = TesseraVerlEngine(model, ds_config, forward_fn=lambda model, mb: model(mb["x"])).initialize()
    with engine.train_mode():
        out = engine.train_batch(batch, loss_function)   # zero_grad, forward_backward_batch, optimizer_step
    weights, peft_config = engine.get_per_tensor_param()  # (name, tensor) for a rollout engine; peft_config None

The config is a DeepSpeed-style dict. A batch is a dict of tensors (and other values, given to every micro-batch)
cut along dim 0 into gradient_accumulation_steps micro-batches; `loss_function(model_output, micro_batch)`
returns (loss, metrics). The engine divides each loss by the accumulation steps and updates at the last, as
DeepSpeed does, so a loss is the micro-batch's own mean.

What tessera does differently (what it cannot do is refused with a tessera.Error, never done halfway):
  - non-finite gradient norm: tessera's engine skips the update itself only under fp16 loss scaling (it then
    computes no norm: optimizer_step returns inf). In fp32 and bf16 it applies the update, as it clips with a NaN
    coefficient, so optimizer_step raises after the fact instead of returning the norm as if verl's skip had
    happened: the weights are non-finite, restore a checkpoint. Skipping before the update would need the norm
    before step(), which the engine does not offer.
  - the norm is computed only when the engine clips: without `gradient_clipping` optimizer_step returns None.
  - no offload (issue 25): to("cpu") is a no-op, as everything is on the CPU already; any other device raises.
  - get_data_parallel_group is a tessera.comm.ProcessGroup (mpu='s data-parallel group, else every launched
    rank), for tessera.comm's collectives, not a torch.distributed group.
"""
import contextlib
import math

import torch

from .. import _tessera, comm
from .._engine import initialize

# An HF causal LM's forward inputs, passed by name when no forward_fn is given.
_HF_INPUTS = ("input_ids", "attention_mask", "position_ids")


def _forward_hf_inputs(model, micro_batch):
    return model(**{k: v for k, v in micro_batch.items() if k in _HF_INPUTS})


def _accumulation_steps(config, world):
    """DeepSpeed's rule: gradient_accumulation_steps, else train_batch_size / (micro batch x ranks), else 1."""
    steps = config.get("gradient_accumulation_steps")
    if isinstance(steps, int):
        return steps
    total, micro = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
    if isinstance(total, int) and isinstance(micro, int):
        return total // (micro * world)
    return 1


def _rows(batch, what):
    """The batch's size along dim 0, which all its tensors share."""
    if not isinstance(batch, dict):
        raise _tessera.Error(f"{what}: the batch must be a dict of tensors, not {type(batch).__name__}")
    rows = {k: v.shape[0] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not rows or len(set(rows.values())) != 1:
        raise _tessera.Error(f"{what}: the batch needs tensors of one batch size along dim 0 (got {rows})")
    return next(iter(rows.values()))


def _split(batch, micro_size):
    """Micro-batches of `micro_size` rows of every tensor (views, no copies); other values go to each whole."""
    n = _rows(batch, "split")
    cut = {k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    return [{k: v[begin:begin + micro_size] if k in cut else v for k, v in batch.items()}
            for begin in range(0, n, micro_size)]


def _detached(value):
    """Outputs kept across micro-batches lose their graphs (each would hold its micro-batch's activations)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    return value


def _concat(outputs):
    """The micro-batches' outputs as one batch's (tensors joined along dim 0, dicts key by key; others listed)."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs) if first.dim() > 0 else torch.stack(outputs)
    if isinstance(first, dict):
        return {k: _concat([o[k] for o in outputs]) for k in first}
    return outputs


class TesseraVerlEngine:
    """A verl engine backend on tessera. `forward_fn(model, micro_batch)` runs the model (call `model`, the engine,
    so ZeRO-3 gathers around the forward) and returns what loss_function gets; by default the micro-batch's
    input_ids / attention_mask / position_ids go in by name. Every call that reaches the engine is collective, as
    the engine's own are: every rank makes it, in the same order."""

    is_param_offload_enabled = is_optimizer_offload_enabled = is_grad_offload_enabled = False

    def __init__(self, module, config, model_parameters=None, optimizer=None, forward_fn=None, mpu=None):
        if not isinstance(config, dict):
            raise _tessera.ConfigError(f"TesseraVerlEngine: config must be a DeepSpeed-style dict (the adapter reads "
                                       f"its batch sizes), not {type(config).__name__}")
        self.module, self.config = module, config
        self._model_parameters, self._client_optimizer = model_parameters, optimizer
        self._forward = forward_fn or _forward_hf_inputs
        self._mpu = mpu  # DeepSpeed's mpu (its data-parallel group a tessera.comm.ProcessGroup), or None
        self._engine = self.optimizer = self.lr_scheduler = None
        self.mode = None

    def initialize(self):
        """Builds tessera's engine (collective). Returns self."""
        self._engine, self.optimizer, _, self.lr_scheduler = initialize(
            model=self.module, optimizer=self._client_optimizer, model_parameters=self._model_parameters,
            config=self.config, mpu=self._mpu)
        self._accumulation = _accumulation_steps(self.config, self.get_data_parallel_size())
        self._micro_size = self.config.get("train_micro_batch_size_per_gpu")
        # The adapter cuts batches by its reading of the config; the engine's own reading must agree.
        if self._engine.is_gradient_accumulation_boundary() != (self._accumulation == 1):
            raise _tessera.ConfigError(f"TesseraVerlEngine: read gradient_accumulation_steps = {self._accumulation} "
                                       f"from the config, which the engine does not; set it explicitly")
        return self

    @property
    def engine(self):
        if self._engine is None:
            raise _tessera.Error("TesseraVerlEngine: call initialize() first")
        return self._engine

    @contextlib.contextmanager
    def _mode(self, mode, zero_grad_on_exit):
        was_training = self.module.training
        self.engine.train(mode == "train")
        self.mode = mode
        try:
            yield self
        finally:
            if zero_grad_on_exit:
                self.engine.zero_grad()  # verl's train scope leaves no gradients behind
            self.engine.train(was_training)
            self.mode = None

    def train_mode(self, disable_auto_offload=False, zero_grad_on_exit=True):
        """A scope with the module in training mode; zero_grad() at its end, as verl's. Nothing to offload."""
        return self._mode("train", zero_grad_on_exit)

    def eval_mode(self, disable_auto_offload=False):
        return self._mode("eval", False)

    def optimizer_zero_grad(self):
        self.engine.zero_grad()

    zero_grad = optimizer_zero_grad

    def forward_backward_batch(self, batch, loss_function, forward_only=False):
        """Forward (and, unless forward_only, backward) over the batch's micro-batches. Training: the batch is
        gradient_accumulation_steps micro-batches, each backward is an engine micro-step, and the update is left to
        optimizer_step(). forward_only: under no_grad, micro-batches of train_micro_batch_size_per_gpu rows (the
        whole batch without one); loss_function may be None. Returns {"model_output": the outputs joined along
        dim 0, "loss": [float per micro-batch], "metrics": {key: [value per micro-batch]}}."""
        what = "forward_backward_batch"
        rows = _rows(batch, what)
        if forward_only:
            # Any cut gives the same outputs; the config's micro-batch size bounds the activations.
            micro = self._micro_size if isinstance(self._micro_size, int) and rows % self._micro_size == 0 else rows
        else:
            if not isinstance(self._micro_size, int):
                raise _tessera.ConfigError(f"{what}: the config needs train_micro_batch_size_per_gpu to cut batches")
            micro = self._micro_size
            if rows != self._accumulation * micro:
                raise _tessera.Error(f"{what}: a batch of {rows} rows is not gradient_accumulation_steps x "
                                     f"train_micro_batch_size_per_gpu = {self._accumulation} x {micro} rows")
            if self.engine.is_gradient_accumulation_boundary() != (self._accumulation == 1):
                raise _tessera.Error(f"{what}: the engine is in the middle of a batch (call optimizer_step() after "
                                     f"each forward_backward_batch)")
        micro_batches = _split(batch, micro)
        outputs, losses, metrics = [], [], {}
        for i, micro_batch in enumerate(micro_batches):
            with torch.no_grad() if forward_only else contextlib.nullcontext():
                output = self._forward(self.engine, micro_batch)
                loss, values = loss_function(output, micro_batch) if loss_function is not None else (None, {})
            if not forward_only:
                self.engine.backward(loss)
                if i + 1 < len(micro_batches):
                    self.engine.step()  # a micro-step: counted, no update (the engine updates at the last)
            outputs.append(_detached(output))
            losses.append(None if loss is None else loss.detach().item())
            for key, value in values.items():
                metrics.setdefault(key, []).append(value)
        return {"model_output": _concat(outputs), "loss": losses, "metrics": metrics}

    def optimizer_step(self):
        """The update at the end of a batch; returns the global gradient norm before clipping (None without
        gradient_clipping; inf when fp16 overflow made the engine skip the update). Raises after an update made
        with a non-finite norm (see the module's docstring)."""
        if not self.engine.is_gradient_accumulation_boundary():
            raise _tessera.Error("optimizer_step: the engine is not at the end of a batch (forward_backward_batch "
                                 "runs a whole batch's micro-steps first)")
        skipped = self.engine.skipped_steps
        self.engine.step()
        if self.engine.skipped_steps > skipped:
            return math.inf
        norm = self.engine.get_global_grad_norm()
        if norm is not None and not math.isfinite(norm):
            raise _tessera.Error(f"optimizer_step: the gradient norm is {norm} and the update was applied (tessera's "
                                 f"engine skips non-finite updates only under fp16 loss scaling); the weights are "
                                 f"no longer finite: restore a checkpoint")
        return norm

    def lr_scheduler_step(self):
        """The lr of the next update (parameter group 0). The engine steps its scheduler (the config's `scheduler`
        section) at every update itself, so nothing is stepped here."""
        return self.engine.get_lr()[0]

    def train_batch(self, batch, loss_function):
        """BaseEngine.train_batch: zero_grad, forward_backward_batch, optimizer_step; the norm in the metrics."""
        self.optimizer_zero_grad()
        outputs = self.forward_backward_batch(batch, loss_function)
        outputs["metrics"]["grad_norm"] = self.optimizer_step()
        return outputs

    def infer_batch(self, batch, loss_function=None):
        return self.forward_backward_batch(batch, loss_function, forward_only=True)

    def get_per_tensor_param(self, layered_summon=False, base_sync_done=False):
        """(a generator of (name, tensor) for every trainable weight, whole, None): verl's pair, the second being
        the PEFT config, which tessera has none of (so the LoRA arguments change nothing). Names are the module's
        named_parameters() names (an HF model's own). Stages 0-2: the live weights (valid until the next update);
        ZeRO-3: copies, as the engine gathers one unit at a time. Collective at ZeRO-3: every rank iterates to the
        end."""
        copy = self.engine.zero_optimization_stage() == 3

        def tensors():
            for name, tensor in self.engine.named_weights():
                yield name, tensor.clone() if copy else tensor

        return tensors(), None

    def get_data_parallel_rank(self):
        return comm.get_rank(self.get_data_parallel_group())

    def get_data_parallel_size(self):
        return comm.get_world_size(self.get_data_parallel_group())

    def get_data_parallel_group(self):
        """The engine's data-parallel group (a tessera.comm.ProcessGroup); before initialize(), mpu's or every rank."""
        if self._engine is not None:
            return self._engine.data_parallel_group
        return self._mpu.get_data_parallel_group() if self._mpu is not None else comm.get_world_group()

    def is_mp_src_rank_with_outputs(self):
        return True  # data parallel only: every rank holds its own micro-batches' outputs

    def to(self, device, model=True, optimizer=True, grad=True):
        """tessera runs on the CPU and has no offload yet (issue 25): "cpu" is where everything already is (a
        no-op); any other device raises a tessera.Error naming it."""
        if grad and not model:
            raise _tessera.Error("to: gradients move with the model (grad=True needs model=True), as in verl")
        if str(device).split(":")[0] != "cpu":
            raise _tessera.Error(f"to({device!r}): tessera runs on the CPU and cannot move or offload its model, "
                                 f"optimizer or gradients yet (issue 25); only 'cpu' is accepted")

    def _keep_last(self, max_ckpt_to_keep):
        keep = self.config.get("tessera", {}).get("checkpoint", {}).get("keep_last", 0)
        if max_ckpt_to_keep is not None and max_ckpt_to_keep != keep:
            raise _tessera.ConfigError(f"save_checkpoint: max_ckpt_to_keep = {max_ckpt_to_keep}, but the engine "
                                       f"keeps {keep or 'every'} checkpoint(s): set tessera.checkpoint.keep_last in "
                                       f"the config instead")

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """The engine's checkpoint in local_path/global_step<N>/ (N: the engine's updates; verl's global_step is
        already in its local_path). Collective. No HDFS copy."""
        if hdfs_path is not None:
            raise _tessera.CheckpointError(f"save_checkpoint: tessera writes {local_path} only, no HDFS copy")
        self._keep_last(max_ckpt_to_keep)
        return self.engine.save_checkpoint(local_path)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=True):
        """Loads the latest checkpoint in local_path; returns (path, client_state). Nothing is deleted (verl
        deletes only a copy it downloaded, and nothing is downloaded here). Collective."""
        if hdfs_path is not None:
            raise _tessera.CheckpointError(f"load_checkpoint: tessera reads {local_path} only, not HDFS")
        return self.engine.load_checkpoint(local_path)
