"""The single-process PyTorch oracle the Python binding's tests compare with: each step differentiates every rank's
loss in this process, averages the gradients as the engine reduces them ((g_0 + ... + g_{W-1}) / W) and steps a
torch.optim optimizer."""


def train_averaged(model, optimizer, loss_of, steps, world, first_step=0):
    """loss_of(model, step, rank) -> loss, for steps first_step .. first_step + steps - 1. Returns copies of the
    trainable parameters after them."""
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(first_step, first_step + steps):
        sums = None
        for r in range(world):
            optimizer.zero_grad(set_to_none=True)
            loss_of(model, step, r).backward()
            grads = [p.grad.clone() for p in params]
            sums = grads if sums is None else [s.add_(g) for s, g in zip(sums, grads)]
        for p, s in zip(params, sums):
            p.grad = s.div_(world)
        optimizer.step()
    return [p.detach().clone() for p in params]
