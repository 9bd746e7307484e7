"""deepspeed.utils' ZeRO-3 leaf modules for Python models: a leaf is gathered whole around its own forward and
nothing below it is a unit, so a block that calls different children (or the same children in another order) on
different ranks, a mixture of experts, gathers the same unit on every rank. Mark before tessera.initialize; it reads
the marks (`_z3_leaf`, DeepSpeed's attribute) with DeepSpeed's default classes (the Mixtral, Qwen2-MoE and
Qwen3-MoE sparse MoE blocks) and the config's zero_optimization.leaf_module names and suffixes.

    tessera.utils.set_z3_leaf_modules(model, [MixtralSparseMoeBlock])   # classes, or class names
    tessera.utils.set_z3_leaf_modules_by_name(model, ["layers.0.mlp"])
    tessera.utils.set_z3_leaf_modules_by_suffix(model, ["mlp"])
"""
import torch

from . import _tessera

_MARK = "_z3_leaf"


def _class_name(module):
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module, classes):
    for c in classes:
        if isinstance(c, type):
            if isinstance(module, c):
                return True
        elif isinstance(c, str):
            if _tessera.z3_class_matches(c, _class_name(module)):
                return True
        else:
            raise _tessera.ConfigError(f"set_z3_leaf_modules: {c!r} is neither a class nor a class name")
    return False


def _mark(model, chosen, flag=True):
    if not isinstance(model, torch.nn.Module):
        raise _tessera.ConfigError("set_z3_leaf_modules: model must be a torch.nn.Module")
    marked = []
    for name, module in model.named_modules():
        if chosen(name, module):
            setattr(module, _MARK, flag)
            marked.append(module)
    return marked


def set_z3_leaf_modules(model, leaf_module_classes):
    """Marks every module of these classes (class objects, or names matched as tessera's C++ leaf classes are: with
    or without the module path); returns the modules marked."""
    classes = list(leaf_module_classes)
    return _mark(model, lambda name, m: _matches(m, classes))


def set_z3_leaf_modules_by_name(model, module_names):
    """Marks the modules of these dotted names; a name the model lacks raises ConfigError (nothing is marked)."""
    names = list(module_names)
    have = {name for name, _ in model.named_modules()}
    missing = [n for n in names if n not in have]
    if missing:
        raise _tessera.ConfigError(f"set_z3_leaf_modules_by_name: the model has no module named {', '.join(missing)}")
    wanted = set(names)
    return _mark(model, lambda name, m: name in wanted)


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes):
    """Marks the modules whose dotted names end with one of these suffixes, as whole components."""
    suffixes = list(module_name_suffixes)
    return _mark(model, lambda name, m: any(_tessera.z3_suffix_matches(s, name) for s in suffixes))


def unset_z3_leaf_modules(model, leaf_module_classes):
    """Removes the marks of the modules of these classes; returns those modules."""
    classes = list(leaf_module_classes)
    return _mark(model, lambda name, m: _matches(m, classes), flag=False)


def z3_leaf_module(module):
    return bool(getattr(module, _MARK, False))


def get_z3_leaf_modules(model):
    return [m for _, m in model.named_modules() if z3_leaf_module(m)]


def leaf_module_names(model, config_classes=()):
    """The dotted names initialize passes to the engine: marked modules, DeepSpeed's default classes and the config's
    zero_optimization.leaf_module.classes (matched against the Python classes' names)."""
    defaults = list(_tessera.default_z3_leaf_classes()) + list(config_classes)
    return [name for name, m in model.named_modules()
            if name and (z3_leaf_module(m) or any(_tessera.z3_class_matches(c, _class_name(m)) for c in defaults))]


def launch_config():
    """The DeepSpeed config tessera-launch --config_file handed this process (Accelerate's plugin or its
    deepspeed_config_file, as a dict), or None. A script fills its "auto" values (the batch sizes, as
    Accelerate's prepare() and the HF Trainer do) and passes it as initialize(config=...); initialize without
    config= takes it as it is."""
    import json

    launched = _tessera.launch_config()
    return None if launched is None else json.loads(launched[0])
