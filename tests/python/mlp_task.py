"""The small regression task the adapter tests train: an MLP 32 -> 64 -> 64 -> 8 from a fixed seed, and each
(step, rank)'s n rows of random inputs and targets."""
import torch


def model_of():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


NAMES = [name for name, _ in model_of().named_parameters()]


def rows(step, r, n):
    g = torch.Generator().manual_seed(10000 * step + r)
    return torch.randn(n, 32, generator=g), torch.randn(n, 8, generator=g)


def mse_loss(model, step, r, n):
    """The MSE of `model` on (step, rank r)'s n rows."""
    x, y = rows(step, r, n)
    return torch.nn.functional.mse_loss(model(x), y)
