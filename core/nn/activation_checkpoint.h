// Activation checkpointing (DeepSpeed's checkpointing.checkpoint, torch.utils.checkpoint): runs a
// block without keeping its activations; its backward runs the block again, with grad, and
// differentiates the recomputation. Memory: the block's input instead of every intermediate.
//
// The block's parameters are inputs of the checkpoint node, so their gradients leave through it
// and are accumulated by the outer backward as usual: gradient-ready hooks (ZeRO's reductions)
// fire once, in the outer backward, and the recomputation's own backward (autograd::grad) touches
// no .grad. Under ZeRO-3 the recomputation gathers the block's units again through their holders.
// The block must compute the same thing twice (no dropout or other randomness without a seeded
// generator of its own); results are bitwise those of the block run plainly.
//
//   x = tessera::nn::checkpoint(*block, [&](const at::Tensor& h) { return block->forward(h); }, x);
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tessera::nn {

using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// `params`: every parameter `fn` reads that needs a gradient. Outside grad mode, or with nothing
// requiring grad, it just calls fn.
std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params);
// One tensor in, one out; the parameters are those of `block` that require grad.
at::Tensor checkpoint(torch::nn::Module& block, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x);

}  // namespace tessera::nn
