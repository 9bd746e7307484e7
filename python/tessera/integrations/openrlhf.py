"""OpenRLHF's DeepSpeed strategy on tessera: what openrlhf/utils/deepspeed/deepspeed.py's DeepspeedStrategy offers
its trainers (PPO, SFT, DPO, reward model), on tessera.initialize's engine.

    strategy = TesseraStrategy(max_norm=1.0, micro_train_batch_size=4, train_batch_size=64, zero_stage=3, args=args)
    strategy.setup_distributed()
    optim = strategy.create_optimizer(model, lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
    engine, optim, scheduler = strategy.prepare((model, optim, None))
    loss = loss_fn(engine(batch))
    strategy.backward(loss, engine, optim)
    strategy.optimizer_step(optim, engine, scheduler)   # an update at each accumulation boundary

The DeepSpeed config is built as OpenRLHF builds it (micro and global batch sizes, ZeRO stage, max_norm as
gradient_clipping, args.param_dtype "bf16" / "fp16" / "fp32", overlap_comm, grad_accum_dtype) and `config` is
merged over it (a `tessera` section, a `scheduler` section). Pass the Hugging Face module itself, not OpenRLHF's
Actor wrapper (unwrap actor.model and put the engine back yourself).

What tessera does not offer, refused with a tessera.Error rather than done halfway:
  - offload_states / reload_states move every state of the given engine to host memory and back (bit for bit);
    args.adam_offload and an eval model's offload are refused (issue 25).
  - all_reduce / all_gather / barrier span every launched rank, as OpenRLHF's do (tessera.comm; other process
    groups: tessera.comm.new_group).
  - save_ckpt's max_mem (a size budget): tessera prunes by count (tessera.checkpoint.keep_last = max_ckpt_num),
    not by size; a warning says so.
  - tensor/sequence parallelism (ds_tensor_parallel_size, ring_attn_size), ZeRO++ (zpg) and deepcompile.
"""
import random
import warnings

import torch

from .. import _tessera, comm, init_distributed
from .._engine import TesseraEngine, initialize

# OpenRLHF's parameters without weight decay (by name suffix): biases and norm weights.
_NO_DECAY = ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight")
# args OpenRLHF may set that tessera cannot honour: (attribute, the value that means "off", why).
_REFUSED = (("adam_offload", False, "offload is not implemented yet (issue 25)"),
            ("ds_tensor_parallel_size", 1, "tessera has no tensor parallelism in training"),
            ("ring_attn_size", 1, "tessera has no sequence parallelism"),
            ("zpg", 1, "tessera has no ZeRO++ hierarchical partitioning"),
            ("deepcompile", False, "tessera has no DeepCompile"))
_DTYPES = {"bf16": {"bf16": {"enabled": True}}, "fp16": {"fp16": {"enabled": True}}, "fp32": {}}


def _merged(base, extra):
    """base with extra's keys laid over it, section by section."""
    out = dict(base)
    for key, value in (extra or {}).items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _engine_of(model, what):
    if not isinstance(model, TesseraEngine):
        raise _tessera.Error(f"{what}: expected the engine prepare() returned, not {type(model).__name__}")
    return model


class TesseraStrategy:
    """OpenRLHF's DeepspeedStrategy calls on tessera. Every call that reaches an engine is collective, as the
    engine's own are: every rank makes it, in the same order."""

    def __init__(self, seed=42, full_determinism=False, max_norm=0.0, micro_train_batch_size=1, train_batch_size=1,
                 zero_stage=2, args=None, max_ckpt_num=None, config=None):
        for name, off, why in _REFUSED:
            if getattr(args, name, off) not in (off, None):
                raise _tessera.ConfigError(f"TesseraStrategy: args.{name} = {getattr(args, name)!r}: {why}")
        self.param_dtype = getattr(args, "param_dtype", "bf16")  # OpenRLHF's default
        if self.param_dtype not in _DTYPES:
            raise _tessera.ConfigError(f"TesseraStrategy: param_dtype {self.param_dtype!r} is not one of "
                                       f"{sorted(_DTYPES)}")
        self.args, self.seed, self.full_determinism, self.max_norm = args, seed, full_determinism, max_norm
        self.stage, self.train_batch_size = zero_stage, train_batch_size
        self.micro_train_batch_size = micro_train_batch_size
        self.max_ckpt_num = max_ckpt_num if max_ckpt_num is not None else getattr(args, "max_ckpt_num", 3)
        self.config = config or {}
        self.is_rlhf = False

    def setup_distributed(self, timeout=None):
        """Seeds this process and checks the launch environment (tessera's communicators are made by each
        engine; there is no process group to create)."""
        random.seed(self.seed)
        torch.manual_seed(self.seed)
        if self.full_determinism:
            torch.use_deterministic_algorithms(True)
        init_distributed()
        self.accumulated_gradient = self.train_batch_size // self.micro_train_batch_size // self.world_size

    @property
    def world_size(self):
        return comm.get_world_size()

    def get_rank(self):
        return comm.get_rank()

    def is_rank_0(self):
        return comm.get_rank() == 0

    def print(self, *msg):
        if self.is_rank_0():
            print(*msg)

    def get_ds_train_config(self, is_actor=False):
        c = {"train_micro_batch_size_per_gpu": self.micro_train_batch_size, "train_batch_size": self.train_batch_size,
             "gradient_clipping": self.max_norm, "zero_optimization": {"stage": self.stage},
             "tessera": {"checkpoint": {"keep_last": self.max_ckpt_num}}, **_DTYPES[self.param_dtype]}
        if getattr(self.args, "use_dynamic_batch", False):  # OpenRLHF: one sample per micro-batch, no accumulation
            c.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
            del c["train_batch_size"]
        if getattr(self.args, "overlap_comm", None) is not None:
            c["zero_optimization"]["overlap_comm"] = bool(self.args.overlap_comm)
        if getattr(self.args, "grad_accum_dtype", None):
            c["data_types"] = {"grad_accum_dtype": self.args.grad_accum_dtype}
        return _merged(c, self.config)

    def get_ds_eval_config(self, offload=False):
        if offload:
            raise _tessera.ConfigError("get_ds_eval_config: offload is not implemented yet (issue 25)")
        c = {"train_micro_batch_size_per_gpu": self.micro_train_batch_size, "zero_optimization": {"stage": 3},
             **_DTYPES[self.param_dtype]}
        return _merged(c, {k: v for k, v in self.config.items() if k in ("tessera",)})

    def create_optimizer(self, model, **kwargs):
        """AdamW (what OpenRLHF's FusedAdam computes: decoupled weight decay) over two groups: kwargs'
        weight_decay for most parameters, none for biases and norm weights. tessera.initialize translates it to
        its flat AdamW."""
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (no_decay if any(n in name for n in _NO_DECAY) else decay).append(p)
        groups = [{"params": decay, "weight_decay": kwargs.get("weight_decay", 0.0)},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], **kwargs)

    def prepare(self, *models_or_model_optim_pairs, is_rlhf=False):
        """(model, optimizer, scheduler) triples become (engine, optimizer, scheduler); a lone model is an eval
        model. Collective."""
        self.is_rlhf = is_rlhf
        out = []
        for arg in models_or_model_optim_pairs:
            if isinstance(arg, tuple):
                if len(arg) != 3:
                    raise _tessera.ConfigError(f"prepare: expected (model, optimizer, scheduler), got {len(arg)} items")
                out.append(self._train_model(*arg) if arg[0] is not None else (None, None, None))
            else:
                out.append(self._eval_model(arg))
        return out[0] if len(out) == 1 else out

    def _train_model(self, model, optimizer, scheduler):
        engine, optimizer, _, scheduler = initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                     config=self.get_ds_train_config())
        return engine, optimizer, scheduler

    def _eval_model(self, model):
        """ZeRO-3: tessera's inference engine (partitioned, gathered around each forward). Below stage 3 the
        module itself: every rank holds it whole, as a stage-0 DeepSpeed engine would, and tessera's engine needs
        an optimizer there."""
        if model is None or self.stage != 3:
            return model
        engine, *_ = initialize(model=model, config=self.get_ds_eval_config())
        return engine

    def backward(self, loss, model, optimizer, **kwargs):
        _engine_of(model, "backward").backward(loss)

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs):
        """engine.step(): an update at each accumulation boundary, a counted micro-step otherwise; the engine
        steps its scheduler itself."""
        _engine_of(model, "optimizer_step").step()

    def save_ckpt(self, model, save_dir, tag=None, max_num=3, max_mem=1000, client_state=None, save_latest=True,
                  optimizer=None, scheduler=None):
        """engine.save_checkpoint(save_dir, tag, client_state, save_latest); the engine keeps the newest
        max_ckpt_num tags (max_num must equal it: it is fixed in the config at prepare). Collective."""
        engine = _engine_of(model, "save_ckpt")
        if max_num != self.max_ckpt_num:
            raise _tessera.ConfigError(f"save_ckpt: max_num = {max_num}, but the engine was prepared to keep "
                                       f"{self.max_ckpt_num} (TesseraStrategy(max_ckpt_num=...))")
        if max_mem is not None:
            warnings.warn("save_ckpt: max_mem is not enforced: tessera keeps the newest max_num checkpoints "
                          "whatever their size", stacklevel=2)
        engine.save_checkpoint(save_dir, tag=tag, client_state=client_state or {}, save_latest=save_latest)

    def load_ckpt(self, model, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                  load_lr_scheduler_states=True, load_module_only=False, optimizer=None, scheduler=None):
        """(load_path, client_state). A missing or damaged checkpoint is a tessera.CheckpointError. Collective."""
        return _engine_of(model, "load_ckpt").load_checkpoint(
            load_dir, tag, load_module_strict=load_module_strict, load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only)

    def save_model(self, model, tokenizer, output_dir, **kwargs):
        """The whole model as Hugging Face's model.safetensors (engine.save_16bit_model: gathered at ZeRO-3, in
        the model's dtype), then, on rank 0, the tokenizer and the module's config.json. Collective."""
        if kwargs:
            raise _tessera.ConfigError(f"save_model: save_pretrained options {sorted(kwargs)} are not taken: tessera "
                                       f"writes model.safetensors itself")
        engine = _engine_of(model, "save_model")
        engine.save_16bit_model(output_dir)
        if self.is_rank_0():
            if tokenizer is not None:
                tokenizer.save_pretrained(output_dir)
            if hasattr(getattr(engine.module, "config", None), "save_pretrained"):
                engine.module.config.save_pretrained(output_dir)
        comm.barrier()  # the rank-0 files are there for every rank afterwards

    def all_reduce(self, data, op="mean"):
        """OpenRLHF's all_reduce: a number, a tensor or a dict of them, over every rank (op mean, max or sum); numbers
        come back as numbers."""
        if isinstance(data, dict):
            return {k: self.all_reduce(v, op) for k, v in data.items()}
        if op not in ("mean", "max", "sum"):
            raise _tessera.ConfigError(f"all_reduce: op '{op}' is not one of mean, max, sum")
        scalar = not isinstance(data, torch.Tensor)
        t = torch.tensor([float(data)]) if scalar else data.detach().clone().contiguous()
        comm.all_reduce(t, op={"mean": "avg", "max": "max", "sum": "sum"}[op])
        return t.item() if scalar else t

    def all_gather(self, data):
        """OpenRLHF's all_gather: every rank's tensor (or dict of them) concatenated along dim 0 in rank order."""
        if isinstance(data, dict):
            return {k: self.all_gather(v) for k, v in data.items()}
        t = torch.tensor([float(data)]) if not isinstance(data, torch.Tensor) else data.detach().contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        comm.all_gather(parts, t)
        return torch.cat(parts)

    def offload_states(self, model=None, pin_memory=True, non_blocking=True):
        """OpenRLHF's offload_deepspeed_states: every state of the model's engine (weights, gradients, masters,
        optimizer states) to host memory before generation; returns {state: bytes moved}."""
        return self._engine_of(model, "offload_states").offload_states(pin_memory=pin_memory, non_blocking=non_blocking)

    def reload_states(self, model=None, non_blocking=True):
        """OpenRLHF's reload_deepspeed_states: what offload_states moved, back bit for bit."""
        return self._engine_of(model, "reload_states").reload_states(non_blocking=non_blocking)

    def _engine_of(self, model, what):
        engine = model
        if not isinstance(engine, TesseraEngine):
            raise _tessera.Error(f"{what}: give the engine prepare() returned (got {type(engine).__name__})")
        return engine
