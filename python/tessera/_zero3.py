"""ZeRO-3 on a Python module: each module whose parameters form a unit gets a forward pre-hook that gathers them
(through the C++ engine's unit call, as a C++ unit holder does) and a forward hook that hands the outputs to it
(their tensor hooks gather again for backward) and releases the unit. Gradients are reported by the engine's
own AccumulateGrad hooks, as in C++."""
import torch


def _tensors(value, out):
    """Appends the tensors in `value` (nested tuples, lists, dicts); returns False if it holds other containers."""
    if isinstance(value, torch.Tensor):
        out.append(value)
        return True
    if isinstance(value, (tuple, list)):
        return all([_tensors(v, out) for v in value])
    if isinstance(value, dict):
        return all([_tensors(v, out) for v in value.values()])
    return value is None or isinstance(value, (int, float, bool, str))


def install_unit_hooks(model, engine):
    """Hooks every unit module of `engine` (a _tessera.Engine) in `model`; returns the hook handles."""
    handles = []
    for prefix in engine.unit_prefixes():
        module = model.get_submodule(prefix) if prefix else model
        calls = []  # a stack: a module may call itself

        def pre(mod, args, prefix=prefix, calls=calls):
            calls.append(engine.unit_begin(prefix))

        def post(mod, args, output, calls=calls):
            outputs = []
            known = _tensors(output, outputs)
            calls.pop().finish(outputs, not known)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles
