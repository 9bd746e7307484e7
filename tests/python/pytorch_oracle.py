"""The single-process PyTorch oracle the Python binding's tests compare with: each step differentiates every rank's
loss in this process, averages the gradients as the engine reduces them ((g_0 + ... + g_{W-1}) / W) and steps a
torch.optim optimizer."""
import torch


def train_averaged(model, optimizer, loss_of, steps, world, first_step=0, micro_batches=1):
    """loss_of(model, step, rank) -> loss, for steps first_step .. first_step + steps - 1 (with micro_batches > 1,
    loss_of(model, step, rank, part) for each part, differentiated one after the other into .grad). Returns copies
    of the trainable parameters after them."""
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(first_step, first_step + steps):
        sums = None
        for r in range(world):
            optimizer.zero_grad(set_to_none=True)
            for part in range(micro_batches):
                (loss_of(model, step, r) if micro_batches == 1 else loss_of(model, step, r, part)).backward()
            grads = [p.grad.clone() for p in params]
            sums = grads if sums is None else [s.add_(g) for s, g in zip(sums, grads)]
        for p, s in zip(params, sums):
            p.grad = s.div_(world)
        optimizer.step()
    return [p.detach().clone() for p in params]


class ClippedAdamW(torch.optim.AdamW):
    """AdamW that clips the (averaged) gradients first, as the engine does, and records the norm."""

    def __init__(self, params, clip, **kwargs):
        super().__init__(params, **kwargs)
        self.clip, self.norms = clip, []

    def step(self, closure=None):
        if self.clip:
            params = [p for g in self.param_groups for p in g["params"]]
            self.norms.append(torch.nn.utils.clip_grad_norm_(params, self.clip).item())
        return super().step(closure)
