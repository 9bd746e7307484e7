#include "core/nn/tiny_gpt.h"

#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "core/nn/activation_checkpoint.h"
#include "core/zero/partitioned_construction.h"
#include "core/zero/unit_holder.h"

namespace tessera::nn {
namespace {

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t n_head, bool bias) : n_head(n_head) {
    c_attn = register_module("c_attn", torch::nn::Linear(torch::nn::LinearOptions(d_model, 3 * d_model).bias(bias)));
    c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(bias)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head;
    auto qkv = c_attn(x).split(C, 2);
    auto shape = [&](const torch::Tensor& t) { return t.view({B, T, n_head, hd}).transpose(1, 2); };
    auto q = shape(qkv[0]), k = shape(qkv[1]), v = shape(qkv[2]);
    auto scores = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
    auto mask = torch::ones({T, T}, torch::kBool).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    auto y = torch::softmax(scores, -1).matmul(v);
    return c_proj(y.transpose(1, 2).contiguous().view({B, T, C}));
  }
  int64_t n_head;
  tessera::Unit<torch::nn::Linear> c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t d_model, bool bias) {
    c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(d_model, 4 * d_model).bias(bias)));
    c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(4 * d_model, d_model).bias(bias)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x))); }
  tessera::Unit<torch::nn::Linear> c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d_model, int64_t n_head, bool bias) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    attn = register_module("attn", CausalSelfAttention(d_model, n_head, bias));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    mlp = register_module("mlp", Mlp(d_model, bias));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  tessera::Unit<torch::nn::LayerNorm> ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptModule : torch::nn::Module {
  explicit GptModule(const GptConfig& c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c.d_model, c.n_head, c.bias));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab_size).bias(false)));
  }
  // Unit holders: a ZeRO-3 engine gathers each around its call (core/zero/unit_holder.h).
  tessera::Unit<torch::nn::Embedding> wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  tessera::Unit<torch::nn::LayerNorm> ln_f{nullptr};
  tessera::Unit<torch::nn::Linear> lm_head{nullptr};
};

}  // namespace

struct TinyGpt::Impl {
  std::shared_ptr<GptModule> module;
};

int64_t gpt_parameter_count(const GptConfig& c) {
  const int64_t d = c.d_model, b = c.bias ? 1 : 0;
  const int64_t block = 2 * 2 * d                  // ln_1, ln_2 (weight + bias)
                        + d * 3 * d + b * 3 * d      // c_attn
                        + d * d + b * d              // attn.c_proj
                        + d * 4 * d + b * 4 * d      // c_fc
                        + 4 * d * d + b * d;         // mlp.c_proj
  return c.vocab_size * d + c.context * d + c.n_layer * block + 2 * d + d * c.vocab_size;
}

TinyGpt::TinyGpt(const GptConfig& config) : config_(config), impl_(std::make_shared<Impl>()) {
  if (config.d_model <= 0 || config.n_head <= 0 || config.d_model % config.n_head != 0)
    throw ConfigError("model: d_model " + std::to_string(config.d_model) + " must be a positive multiple of n_head " +
                      std::to_string(config.n_head));
  if (config.vocab_size <= 0 || config.context <= 0 || config.n_layer < 0)
    throw ConfigError("model: vocab_size, context must be positive and n_layer >= 0");
  // Initialise from the config's seed (this resets LibTorch's global generator), with
  // GPT-2's scheme, N(0, 0.02) for weights and embeddings, zeros for biases, ones for LayerNorm.
  torch::manual_seed(config.seed);
  impl_->module = std::make_shared<GptModule>(config);
  torch::NoGradGuard no_grad;
  for (auto& item : impl_->module->named_parameters()) {
    const auto& name = item.key();
    // A parameter cut by partitioned construction has no memory: its value is made whole (the
    // same random numbers) and this rank's chunk kept.
    const bool cut = zero::constructed_chunk(item.value()).has_value();
    auto p = cut ? at::empty(item.value().sizes(), item.value().options()) : item.value();
    const bool layer_norm = name.find("ln_") != std::string::npos;
    if (layer_norm) {
      p.fill_(name.size() > 5 && name.substr(name.size() - 4) == "bias" ? 0.0 : 1.0);
    } else if (name.size() > 5 && name.substr(name.size() - 4) == "bias") {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02);
    }
    if (cut) zero::write_constructed(item.value(), p);
  }
}

TinyGpt::~TinyGpt() = default;

at::Tensor TinyGpt::forward(const at::Tensor& tokens) const {
  auto& m = *impl_->module;
  if (tokens.dim() != 2 || tokens.size(1) > config_.context)
    throw Error("TinyGpt::forward: tokens must be [B, T] with T <= context " + std::to_string(config_.context));
  auto positions = torch::arange(tokens.size(1), torch::kLong);
  auto x = m.wte(tokens) + m.wpe(positions);
  for (const auto& block : *m.h) {
    auto* b = block->as<BlockImpl>();
    x = config_.checkpoint_blocks ? checkpoint(*b, [b](const at::Tensor& h) { return b->forward(h); }, x) : b->forward(x);
  }
  return m.lm_head(m.ln_f(x));
}

at::Tensor TinyGpt::loss(const at::Tensor& tokens, const at::Tensor& targets) const {
  auto logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::shared_ptr<torch::nn::Module> TinyGpt::module() const { return impl_->module; }

}  // namespace tessera::nn
