#!/usr/bin/python3
"""Writes SYNTHETIC DeepSpeed ZeRO checkpoints for tessera's importer tests (deepspeed_synthetic_test.cpp).

These files were NOT written by DeepSpeed: there is no DeepSpeed here. Their structure (file names,
keys, nesting, pickled classes, flat-partition layout) follows what ../shared/fixtures/
deepspeed_checkpoints/README.md documents for DeepSpeed v0.14.5's real files, extended to the paths
those small fixtures do not show: bf16 (the bf16_ file prefix, 16-bit module weights beside fp32
masters), fp16 with a dynamic loss scaler, padding on the last rank, several parameter groups,
ZeRO-3 sub-groups, frozen parameters. Layout rules written here:
  ZeRO-1/2: per parameter group, the group's tensors concatenated in group order, padded at the end
    to a multiple of 2 x world (DeepSpeed's alignment), cut into `world` equal partitions; the
    module's 16-bit weights are views into that padded 16-bit flat buffer.
  ZeRO-3: each tensor cut into shares of ceil(numel / world) (zero padding on the last ranks); a
    rank's flat sub-group concatenates its shares of the sub-group's tensors. Sub-groups split a
    parameter group once their share sizes reach sub_group_size; param_shapes lists sub-groups.
DeepSpeed's classes are stand-ins registered under DeepSpeed's module paths in sys.modules, so
torch.save writes the same GLOBAL references a real file holds.

Usage: /usr/bin/python3 make_ds_checkpoint.py OUT_DIR   (Debian's python3 with torch 1.13)
Writes, per case, OUT_DIR/<case>/ckpt/ (latest, global_step<N>/...) and OUT_DIR/<case>/expected/:
  <param>.master, <param>.exp_avg, <param>.exp_avg_sq: the full fp32 tensors, raw little-endian;
  <param>.param: the module's weights (raw bf16/f16 bits); counters.json: what the manifest must say.
"""
import collections
import dataclasses
import enum
import json
import os
import sys
import types

import torch


def register(module_name, cls):
    """Makes `cls` importable as module_name.<its name>, creating the modules on the way."""
    parts = module_name.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], sys.modules[name])
    cls.__module__ = module_name
    cls.__qualname__ = cls.__name__
    setattr(sys.modules[module_name], cls.__name__, cls)


class LossScaler:  # stand-in: a static scaler's attributes
    def __init__(self, scale):
        self.cur_scale = scale
        self.dynamic = False


class DynamicLossScaler:  # stand-in: a dynamic scaler's attributes, in the order DeepSpeed sets them
    def __init__(self, cur_scale, cur_iter, last_overflow_iter, delayed_shift, cur_hysteresis):
        self.cur_scale = cur_scale
        self.dynamic = True
        self.cur_iter = cur_iter
        self.last_overflow_iter = last_overflow_iter
        self.scale_factor = 2.0
        self.scale_window = 1000
        self.min_scale = 1
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = cur_hysteresis
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dtype = torch.float16  # pickled as a reference to torch.float16


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    numel: int
    start: int


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


register("deepspeed.runtime.fp16.loss_scaler", LossScaler)
register("deepspeed.runtime.fp16.loss_scaler", DynamicLossScaler)
register("deepspeed.utils.tensor_fragment", fragment_address)
register("deepspeed.runtime.zero.config", ZeroStageEnum)

OD = collections.OrderedDict
STATES = ("exp_avg", "exp_avg_sq")

# Each case: model order of (name, shape, group); per group lr. Sizes chosen so the last rank pads.
CASES = {
    # bf16 ZeRO-2, 3 ranks, weights (decay) and biases (no decay) in two groups, interleaved in the
    # model: group 0 holds 35 + 15 = 50 elements -> 54, P = 18 (last rank: 14 + 4 padding); group 1
    # holds 5 + 4 = 9 -> 12, P = 4 (last rank: 1 + 3 padding).
    "z2_bf16_w3_groups": dict(stage=2, world=3, dtype=torch.bfloat16, lrs=[1e-3, 5e-4], steps=(6, 0), gas=2,
                              params=[("a.weight", (5, 7), 0), ("a.bias", (5,), 1), ("b.weight", (3, 5), 0),
                                      ("b.bias", (4,), 1)]),
    # fp16 ZeRO-1, 2 ranks, a dynamic loss scaler that skipped 2 of 7 steps: 21 elements -> 24, P = 12.
    "z1_fp16_dynamic": dict(stage=1, world=2, dtype=torch.float16, lrs=[2e-3], steps=(7, 2), gas=1,
                            scaler=dict(cur_scale=16384.0, cur_iter=7, last_overflow_iter=4, delayed_shift=2,
                                        cur_hysteresis=1),
                            params=[("l0.weight", (3, 3), 0), ("l0.bias", (5,), 0), ("l1.weight", (2, 3), 0),
                                    ("l1.bias", (1,), 0)]),
    # bf16 ZeRO-3, 2 ranks, two groups, sub_group_size 10: group 0 -> sub-groups [c.weight (share 8),
    # c.bias (2)] and [d.weight (6)], group 1 -> [e.weight (4)]; odd sizes pad the last rank.
    "z3_bf16_subgroups": dict(stage=3, world=2, dtype=torch.bfloat16, lrs=[2e-4, 1e-4], steps=(4, 0), gas=1,
                              sub_group_size=10,
                              params=[("c.weight", (3, 5), 0), ("c.bias", (3,), 0), ("d.weight", (4, 3), 0),
                                      ("e.weight", (7,), 1)]),
    # z2_bf16_w3_groups with a frozen parameter (requires_grad False): imported whole.
    "z2_bf16_frozen": dict(stage=2, world=3, dtype=torch.bfloat16, lrs=[1e-3, 5e-4], steps=(6, 0), gas=2,
                           frozen=[("frozen.weight", (2, 2))],
                           params=[("a.weight", (5, 7), 0), ("a.bias", (5,), 1), ("b.weight", (3, 5), 0),
                                   ("b.bias", (4,), 1)]),
    # bf16 ZeRO-3, 2 ranks, two frozen parameters (15 elements: shares of 8, the last padded; 4: shares of 2).
    "z3_bf16_frozen": dict(stage=3, world=2, dtype=torch.bfloat16, lrs=[2e-4], steps=(3, 0), gas=1, sub_group_size=10,
                           frozen=[("emb.weight", (3, 5)), ("norm.weight", (4,))],
                           params=[("c.weight", (3, 5), 0), ("c.bias", (3,), 0)]),
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def ds_config(case):
    zero = {"stage": case["stage"], "contiguous_gradients": True, "overlap_comm": False}
    if "sub_group_size" in case:
        zero["sub_group_size"] = case["sub_group_size"]
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": case["gas"],
              "zero_optimization": zero,
              "optimizer": {"type": "Adam", "params": {"lr": case["lrs"][0], "betas": [0.9, 0.999], "eps": 1e-08}}}
    if case["dtype"] == torch.bfloat16:
        config["bf16"] = {"enabled": True}
    else:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "hysteresis": case["scaler"]["delayed_shift"]}
    return config


def adam_group(lr, params):
    return {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.0, "amsgrad": False, "maximize": False,
            "foreach": None, "capturable": False, "differentiable": False, "fused": False, "params": params}


def loss_scaler(case):
    if case["dtype"] == torch.float16:
        return DynamicLossScaler(**case["scaler"])
    return LossScaler(1.0)


def full_tensors(case, gen):
    """The full fp32 masters and Adam states, per parameter name."""
    out = {}
    for name, shape, _ in case["params"]:
        out[name] = {"master": torch.randn(shape, generator=gen),
                     "exp_avg": torch.randn(shape, generator=gen) * 0.01,
                     "exp_avg_sq": torch.rand(shape, generator=gen) * 1e-4}
    return out


def model_states(case, module, param_shapes, frozen_fragments):
    global_steps, skipped = case["steps"]
    frozen = case.get("frozen", [])
    return dict([  # a plain dict at the root, as DeepSpeed saves it
        ("module", module), ("buffer_names", []), ("optimizer", None), ("param_shapes", param_shapes),
        ("frozen_param_shapes", OD((n, torch.Size(s)) for n, s in frozen)), ("shared_params", {}),
        ("frozen_param_fragments", frozen_fragments), ("lr_scheduler", None), ("data_sampler", None),
        ("random_ltd", None), ("sparse_tensor_module_names", set()), ("skipped_steps", skipped),
        ("global_steps", global_steps), ("global_samples", global_steps * 4 * case["gas"] * case["world"]),
        ("dp_world_size", case["world"]), ("mp_world_size", 1), ("ds_config", ds_config(case)),
        ("ds_version", "0.14.5")])


def write_zero12(case, tensors, frozen_tensors, tag_dir):
    W, dtype = case["world"], case["dtype"]
    groups = [[(n, s) for n, s, g in case["params"] if g == i] for i in range(len(case["lrs"]))]
    flats16, flats = [], []  # per group: the padded 16-bit flat buffer; per kind the padded fp32 flat
    for members in groups:
        total = sum(numel(s) for _, s in members)
        padded = -(-total // (2 * W)) * (2 * W)
        flat = {k: torch.zeros(padded) for k in ("master",) + STATES}
        offset = 0
        for name, shape in members:
            for k in flat:
                flat[k][offset:offset + numel(shape)] = tensors[name][k].flatten()
            offset += numel(shape)
        flats.append((flat, total, padded // W))
        flats16.append(flat["master"].to(dtype))
    module = OD()
    for name, shape, g in case["params"]:  # model order: views into the group's 16-bit flat buffer
        offset = 0
        for n, s in groups[g]:
            if n == name:
                break
            offset += numel(s)
        module[name] = flats16[g].narrow(0, offset, numel(shape)).view(shape)
    fragments = OD()
    for name, shape in case.get("frozen", []):
        module[name] = frozen_tensors[name]
        fragments[name] = module[name].detach().clone()  # whole, in its shape (DeepSpeed keeps the parameter)
    param_shapes = [OD((n, torch.Size(s)) for n, s in members) for members in groups]
    torch.save(model_states(case, module, param_shapes, fragments), os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    prefix = "bf16_" if dtype == torch.bfloat16 else ""
    for r in range(W):
        state, partitions, paddings, mappings = {}, [], [], []
        for g, (flat, total, P) in enumerate(flats):
            part = {k: v[r * P:(r + 1) * P].clone() for k, v in flat.items()}
            partitions.append(part["master"])
            state[g] = {"step": torch.tensor(float(case["steps"][0] - case["steps"][1])),
                        "exp_avg": part["exp_avg"], "exp_avg_sq": part["exp_avg_sq"]}
            paddings.append(W * P - total if r == W - 1 else 0)
            mapping, offset = OD(), 0
            for name, shape in groups[g]:
                begin, end = max(offset, r * P), min(offset + numel(shape), (r + 1) * P)
                if begin < end:
                    mapping[name] = fragment_address(numel=end - begin, start=begin - r * P)
                offset += numel(shape)
            mappings.append(mapping)
        osd = OD([
            ("loss_scaler", loss_scaler(case)), ("dynamic_loss_scale", dtype == torch.float16), ("overflow", False),
            ("clip_grad", 0.0),
            ("base_optimizer_state", {"state": state,
                                      "param_groups": [adam_group(lr, [g]) for g, lr in enumerate(case["lrs"])]}),
            ("single_partition_of_fp32_groups", partitions), ("zero_stage", ZeroStageEnum(case["stage"])),
            ("group_paddings", paddings), ("partition_count", [W] * len(groups)), ("ds_version", "0.14.5"),
            ("param_slice_mappings", mappings)])
        torch.save({"optimizer_state_dict": dict(osd), "ds_config": ds_config(case), "ds_version": "0.14.5"},
                   os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def sub_groups(case):
    """ZeRO-3's sub-groups: (group, [(name, shape)]), split once the shares reach sub_group_size."""
    W, out = case["world"], []
    for g in range(len(case["lrs"])):
        members = [(n, s) for n, s, gg in case["params"] if gg == g]
        current, size = [], 0
        for i, (name, shape) in enumerate(members):
            current.append((name, shape))
            size += -(-numel(shape) // W)
            if size >= case["sub_group_size"] or i == len(members) - 1:
                out.append((g, current))
                current, size = [], 0
    return out


def write_zero3(case, tensors, frozen_tensors, tag_dir):
    W, dtype, subs = case["world"], case["dtype"], sub_groups(case)
    param_shapes = [OD((n, torch.Size(s)) for n, s in members) for _, members in subs]
    prefix = "bf16_" if dtype == torch.bfloat16 else ""
    for r in range(W):
        module = OD((n, torch.empty(0, dtype=dtype)) for n, _, _ in case["params"])  # partitioned away
        fragments = OD()  # frozen parameters: this rank's share of ceil(numel / W), zero-padded (ds_tensor)
        for name, shape in case.get("frozen", []):
            share = -(-numel(shape) // W)
            padded = torch.zeros(share * W, dtype=dtype)
            padded[:numel(shape)] = frozen_tensors[name].flatten()
            module[name] = torch.empty(0, dtype=dtype)
            fragments[name] = padded[r * share:(r + 1) * share].clone()
        torch.save(model_states(case, module, param_shapes, fragments),
                   os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
        flats, state = [], {}
        for i, (_, members) in enumerate(subs):
            shares = {k: [] for k in ("master",) + STATES}
            for name, shape in members:
                share = -(-numel(shape) // W)
                for k in shares:
                    padded = torch.zeros(share * W)
                    padded[:numel(shape)] = tensors[name][k].flatten()
                    shares[k].append(padded[r * share:(r + 1) * share])
            flats.append(torch.cat(shares["master"]))
            state[i] = {"step": torch.tensor(float(case["steps"][0] - case["steps"][1])),
                        "exp_avg": torch.cat(shares["exp_avg"]), "exp_avg_sq": torch.cat(shares["exp_avg_sq"])}
        groups = [adam_group(lr, [i for i, (gg, _) in enumerate(subs) if gg == g]) for g, lr in enumerate(case["lrs"])]
        osd = OD([("zero_stage", ZeroStageEnum.weights), ("loss_scaler", loss_scaler(case)),
                  ("dynamic_loss_scale", dtype == torch.float16), ("overflow", False), ("partition_count", W),
                  ("optimizer_state_dict", {"state": state, "param_groups": groups}), ("fp32_flat_groups", flats)])
        torch.save({"optimizer_state_dict": dict(osd), "ds_config": ds_config(case), "ds_version": "0.14.5"},
                   os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def raw(t):
    t = t.contiguous().flatten()
    return (t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t).numpy().tobytes()


def write_expected(case, tensors, frozen_tensors, out):
    os.makedirs(out)
    for name, t in frozen_tensors.items():
        with open(os.path.join(out, f"{name}.frozen"), "wb") as f:
            f.write(raw(t))
    for name, _, _ in case["params"]:
        for k, t in tensors[name].items():
            with open(os.path.join(out, f"{name}.{k}"), "wb") as f:
                f.write(raw(t))
        with open(os.path.join(out, f"{name}.param"), "wb") as f:
            f.write(raw(tensors[name]["master"].to(case["dtype"])))
    global_steps, skipped = case["steps"]
    counters = {"stage": case["stage"], "world": case["world"],
                "dtype": "bf16" if case["dtype"] == torch.bfloat16 else "f16",
                "parameters": [n for n, _, _ in case["params"]], "global_steps": global_steps,
                "skipped_steps": skipped, "micro_steps": global_steps * case["gas"],
                "optimizer_step": global_steps - skipped, "group_lrs": case["lrs"],
                "frozen": [n for n, _ in case.get("frozen", [])]}
    if "scaler" in case:
        s = case["scaler"]
        counters["loss_scaler"] = {"scale": s["cur_scale"], "iteration": s["cur_iter"],
                                   "last_overflow_iteration": s["last_overflow_iter"],
                                   "hysteresis_left": s["cur_hysteresis"]}
    with open(os.path.join(out, "counters.json"), "w") as f:
        json.dump(counters, f, indent=1)


def main(out_dir):
    for i, (name, case) in enumerate(CASES.items()):
        gen = torch.Generator().manual_seed(4321 + i)
        tensors = full_tensors(case, gen)
        frozen_tensors = {n: torch.randn(shape, generator=gen).to(case["dtype"]) for n, shape in case.get("frozen", [])}
        tag = f"global_step{case['steps'][0]}"
        ckpt = os.path.join(out_dir, name, "ckpt")
        os.makedirs(os.path.join(ckpt, tag))
        with open(os.path.join(ckpt, "latest"), "w") as f:
            f.write(tag)
        if case["stage"] == 3:
            write_zero3(case, tensors, frozen_tensors, os.path.join(ckpt, tag))
        else:
            write_zero12(case, tensors, frozen_tensors, os.path.join(ckpt, tag))
        write_expected(case, tensors, frozen_tensors, os.path.join(out_dir, name, "expected"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_ds_checkpoint.py OUT_DIR")
    main(sys.argv[1])
