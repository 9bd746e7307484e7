"""A client torch.optim optimizer given to tessera.initialize (DeepSpeed's `optimizer=`), as the C++ API takes one:
torch.optim.Adam, AdamW, SGD and Adagrad (those classes exactly, not subclasses, which may change step()) are
translated to the engine's flat optimizers, group by group, and give the client class's results bit for bit; any
other torch.optim.Optimizer runs its own step() on the engine's flat partitions (its param_groups then hold the
partitions, and its state is keyed by them). A callable is DeepSpeed's optimizer factory: called with
model_parameters (or the model's parameters) to build the optimizer. Settings with no flat equivalent (maximize,
capturable, differentiable, fused) are refused by name; keys a group carries that are not its class's settings
(a group's "name", say) are the user's and are ignored."""
import torch

from . import _tessera

_TRANSLATED = {torch.optim.Adam: _tessera.ClientKind.Adam, torch.optim.AdamW: _tessera.ClientKind.AdamW,
               torch.optim.SGD: _tessera.ClientKind.SGD, torch.optim.Adagrad: _tessera.ClientKind.Adagrad}
# The settings each translated class maps (betas as beta1, beta2); "foreach" only picks torch's implementation.
_MAPPED = {"lr", "betas", "eps", "weight_decay", "amsgrad", "momentum", "dampening", "nesterov", "lr_decay",
           "initial_accumulator_value", "foreach"}


def parameter_name(p, names_of, where):
    """The dotted name of parameter p (names_of: id -> name of the model's parameters); an error naming `where`
    for anything else."""
    if not isinstance(p, torch.Tensor) or id(p) not in names_of:
        raise _tessera.ConfigError(f"initialize: {where} holds a tensor that is not a parameter of the model")
    return names_of[id(p)]


def _settings(optimizer, group, g, translated):
    """The group's settings as the C++ side takes them (numbers; bools 0/1; betas split)."""
    out = {}
    for key in optimizer.defaults:
        value = group.get(key, optimizer.defaults[key])
        if key == "lr":
            out["lr"] = float(value)
        elif not translated:
            continue  # the client's own step() reads its settings itself
        elif key == "betas":
            out["beta1"], out["beta2"] = float(value[0]), float(value[1])
        elif key in _MAPPED:
            if key != "foreach":
                out[key] = float(value)
        elif value not in (None, False):
            raise _tessera.ConfigError(f"initialize: the client optimizer {type(optimizer).__name__}'s param group {g} "
                                       f"sets '{key}'={value!r}, which tessera's flat optimizers do not have; leave it "
                                       f"at its default")
    return out


def client_optimizer(model, optimizer, model_parameters):
    """(kind, [(names, settings)], python_step or None, the optimizer) for _tessera.initialize."""
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(model_parameters if model_parameters is not None else model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise _tessera.ConfigError(f"initialize: optimizer must be a torch.optim.Optimizer or a callable that builds "
                                   f"one, not {type(optimizer).__name__}")
    stepped = [s for s in optimizer.state.values() if float(s.get("step", 1)) != 0]  # Adagrad makes step-0 state
    if stepped:
        raise _tessera.ConfigError(f"initialize: the client optimizer already holds state for {len(stepped)} "
                                   f"parameters; pass a fresh optimizer")
    kind = _TRANSLATED.get(type(optimizer), _tessera.ClientKind.PythonStep)
    translated = kind != _tessera.ClientKind.PythonStep
    names_of = {id(p): name for name, p in model.named_parameters()}
    groups = [([parameter_name(p, names_of, f"the client optimizer's param group {g}")
                for p in group["params"]], _settings(optimizer, group, g, translated))
              for g, group in enumerate(optimizer.param_groups)]
    if translated:
        return kind, groups, None, optimizer

    def python_step(partitions, lrs):
        # The engine's partitions (gradients set) replace the model's parameters in the client's groups; the
        # same tensor objects every update, so the client's state stays keyed by them.
        for group, params, lr in zip(optimizer.param_groups, partitions, lrs):
            group["params"], group["lr"] = params, lr
        optimizer.step()

    for group in optimizer.param_groups:
        group["params"] = []  # the engine steps it: the model's own parameters are no longer the client's
    return kind, groups, python_step, optimizer
