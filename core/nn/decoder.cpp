#include "core/nn/decoder.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/text.h"
#include "core/io/weight_directory.h"
#include "core/zero/partitioned_construction.h"
#include "core/zero/unit_holder.h"

namespace tessera::nn {
namespace F = torch::nn::functional;
namespace {

// What every module of one model needs to know about the split.
struct Geometry {
  DecoderConfig config;
  TensorParallel tp;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // on this rank
};

// Row-parallel Linear: each rank multiplies its input columns, the partial sums are added over the
// group, and the (replicated) bias is added once, after the sum.
torch::Tensor row_parallel(tessera::Unit<torch::nn::Linear>& linear, const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.sharded()) return linear(x);  // through the holder: ZeRO-3 gathers it (tensor parallelism never runs under ZeRO-3)
  auto y = F::linear(x, linear->weight).contiguous();
  tp.all_reduce_sum(y);
  return linear->bias.defined() ? y + linear->bias : y;
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t n, double eps) : eps(eps) { weight = register_parameter("weight", torch::ones({n})); }
  // In fp32 whatever the dtype, rounded back before the weight (as transformers does).
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x.to(torch::kFloat);
    h = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps);
    return weight * h.to(x.scalar_type());
  }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Geometry& g) : g(g) {
    const auto& c = g.config;
    const int64_t d = c.hidden_size, hd = g.head_dim;
    q_proj = register_module("q_proj", linear(d, g.heads * hd, c.qkv_bias));
    k_proj = register_module("k_proj", linear(d, g.kv_heads * hd, c.qkv_bias));
    v_proj = register_module("v_proj", linear(d, g.kv_heads * hd, c.qkv_bias));
    o_proj = register_module("o_proj", linear(g.heads * hd, d, c.o_bias));
    if (c.qk_norm) {
      q_norm = register_module("q_norm", RmsNorm(hd, c.rms_norm_eps));
      k_norm = register_module("k_norm", RmsNorm(hd, c.rms_norm_eps));
    }
  }
  // x [B, T, d]; cos/sin [B, 1, T, hd]; bias [B or 1, 1, 1, T, S] (0 or -inf).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias, KvCache* cache, size_t layer) {
    const auto B = x.size(0), T = x.size(1), hd = g.head_dim, H = g.heads, KV = g.kv_heads;
    auto q = q_proj(x).view({B, T, H, hd});
    auto k = k_proj(x).view({B, T, KV, hd});
    auto v = v_proj(x).view({B, T, KV, hd}).transpose(1, 2);
    if (q_norm) q = q_norm(q), k = k_norm(k);
    q = q.transpose(1, 2), k = k.transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    if (cache) {
      auto& keys = cache->keys[layer];
      auto& values = cache->values[layer];
      keys.narrow(2, cache->length, T).copy_(k);
      values.narrow(2, cache->length, T).copy_(v);
      k = keys.narrow(2, 0, cache->length + T);
      v = values.narrow(2, 0, cache->length + T);
    }
    // GQA without copies: query heads grouped under their KV head, KV broadcast over the group.
    const auto G = H / KV;
    auto scores = torch::matmul(q.reshape({B, KV, G, T, hd}), k.unsqueeze(2).transpose(-1, -2));
    scores = scores.to(torch::kFloat) * (1.0 / std::sqrt(double(hd))) + bias;
    auto probs = torch::softmax(scores, -1).to(v.scalar_type());
    auto out = torch::matmul(probs, v.unsqueeze(2));  // [B, KV, G, T, hd]
    out = out.reshape({B, H, T, hd}).transpose(1, 2).reshape({B, T, H * hd});
    return row_parallel(o_proj, out, g.tp);
  }
  Geometry g;
  tessera::Unit<torch::nn::Linear> q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  tessera::Unit<RmsNorm> q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(Attention);

struct SwiGluImpl : torch::nn::Module {
  explicit SwiGluImpl(const Geometry& g) : tp(g.tp) {
    const auto& c = g.config;
    const int64_t f = c.intermediate_size / g.tp.size;
    gate_proj = register_module("gate_proj", linear(c.hidden_size, f, c.mlp_bias));
    up_proj = register_module("up_proj", linear(c.hidden_size, f, c.mlp_bias));
    down_proj = register_module("down_proj", linear(f, c.hidden_size, c.mlp_bias));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return row_parallel(down_proj, torch::silu(gate_proj(x)) * up_proj(x), tp);
  }
  TensorParallel tp;
  tessera::Unit<torch::nn::Linear> gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGlu);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const Geometry& g) {
    self_attn = register_module("self_attn", Attention(g));
    mlp = register_module("mlp", SwiGlu(g));
    input_layernorm = register_module("input_layernorm", RmsNorm(g.config.hidden_size, g.config.rms_norm_eps));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RmsNorm(g.config.hidden_size, g.config.rms_norm_eps));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& bias,
                        KvCache* cache, size_t layer) {
    x = x + self_attn->forward(input_layernorm(x), cos, sin, bias, cache, layer);
    return x + mlp(post_attention_layernorm(x));
  }
  Attention self_attn{nullptr};
  SwiGlu mlp{nullptr};
  tessera::Unit<RmsNorm> input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct BackboneImpl : torch::nn::Module {
  explicit BackboneImpl(const Geometry& g) {
    const auto& c = g.config;
    embed_tokens = register_module("embed_tokens",
                                   torch::nn::Embedding(padded_vocab_size(c, g.tp.size) / g.tp.size, c.hidden_size));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(g));
    norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  }
  tessera::Unit<torch::nn::Embedding> embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  tessera::Unit<RmsNorm> norm{nullptr};
};
TORCH_MODULE(Backbone);

struct CausalLmModule : torch::nn::Module {
  explicit CausalLmModule(const Geometry& g) {
    model = register_module("model", Backbone(g));
    if (!g.config.tie_word_embeddings)
      lm_head = register_module("lm_head", linear(g.config.hidden_size,
                                                  padded_vocab_size(g.config, g.tp.size) / g.tp.size, false));
  }
  Backbone model{nullptr};
  tessera::Unit<torch::nn::Linear> lm_head{nullptr};
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, keyed by the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

struct DecoderLm::Impl {
  Geometry geometry;
  std::shared_ptr<CausalLmModule> module;
  torch::Tensor inv_freq;  // [hd / 2] fp32, as transformers computes it
};

DecoderLm::DecoderLm(const DecoderConfig& config, DecoderOptions options)
    : config_(config), options_(std::move(options)), impl_(std::make_shared<Impl>()) {
  auto& tp = options_.tp;
  check_tp_size(config_, tp.size);
  if (tp.rank < 0 || tp.rank >= tp.size)
    throw ConfigError("tensor parallel rank " + std::to_string(tp.rank) + " outside [0, " + std::to_string(tp.size) + ")");
  if (tp.sharded() && !(tp.all_reduce_sum && tp.all_gather && tp.broadcast))
    throw Error("DecoderLm: a tensor-parallel size > 1 needs the all_reduce_sum, all_gather and broadcast callbacks");
  auto& g = impl_->geometry;
  g.config = config_;
  g.tp = tp;
  g.heads = local_heads(config_, tp.size);
  g.kv_heads = local_kv_heads(config_, tp.size);
  g.head_dim = config_.head_dim;
  impl_->module = std::make_shared<CausalLmModule>(g);
  const auto hd = config_.head_dim;
  impl_->inv_freq =
      1.0 / torch::pow(torch::tensor(config_.rope_theta, torch::kFloat), torch::arange(0, hd, 2, torch::kLong).to(torch::kFloat) / float(hd));

  // Every weight drawn whole, then cut: TP 1 and TP n hold the same model.
  const double std_dev = options_.init_std >= 0 ? options_.init_std : config_.initializer_range;
  torch::NoGradGuard no_grad;
  auto params = impl_->module->named_parameters();
  // Parameters cut by partitioned construction have no memory: each value is made whole and this
  // rank's chunk kept (zero/partitioned_construction.h); their dtype stays fp32.
  bool cut = false;
  for (auto& item : params) cut = cut || zero::constructed_chunk(item.value()).has_value();
  if (cut && options_.dtype != torch::kFloat)
    throw Error("DecoderLm: partitioned construction builds fp32 weights (the engine's bf16 or fp16 settings convert "
                "them at initialize); this model asks for " + std::string(c10::toString(options_.dtype)));
  auto write = [](torch::Tensor& p, const torch::Tensor& value) {
    if (!zero::write_constructed(p, value)) p.copy_(value);
  };
  if (!options_.random_init) {
    for (auto& item : params) write(item.value(), torch::zeros(item.value().sizes()));
    if (!cut) impl_->module->to(options_.dtype);
    return;
  }
  for (const auto& [name, shape] : decoder_parameter_shapes(config_)) {
    torch::Tensor full;
    if (ends_with(name, "norm.weight")) {
      full = torch::ones(shape);
    } else if (ends_with(name, ".bias")) {
      full = torch::zeros(shape);
    } else {
      auto generator = at::detail::createCPUGenerator(name_seed(options_.seed, name));
      full = torch::empty(shape).normal_(0.0, std_dev, generator);
    }
    auto* p = params.find(name);
    if (!p) throw Error("DecoderLm: internal: no parameter " + name);
    write(*p, cut_shard(full, decoder_tp_shard(config_, name, tp.rank, tp.size)));
  }
  if (!cut) impl_->module->to(options_.dtype);
}

DecoderLm::~DecoderLm() = default;

std::shared_ptr<torch::nn::Module> DecoderLm::module() const { return impl_->module; }

KvCache DecoderLm::new_cache(int64_t batch, int64_t capacity) const {
  KvCache cache;
  cache.capacity = capacity;
  const auto& g = impl_->geometry;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(torch::empty({batch, g.kv_heads, capacity, g.head_dim}, torch::dtype(options_.dtype)));
    cache.values.push_back(torch::empty({batch, g.kv_heads, capacity, g.head_dim}, torch::dtype(options_.dtype)));
  }
  return cache;
}

at::Tensor DecoderLm::forward(const at::Tensor& ids, const DecoderInputs& in) const {
  auto& m = *impl_->module;
  const auto& tp = options_.tp;
  if (ids.dim() != 2 || ids.scalar_type() != torch::kLong)
    throw Error("DecoderLm::forward: input_ids must be [B, T] int64, got " + std::string(ids.toString()) +
                " of dim " + std::to_string(ids.dim()));
  const int64_t B = ids.size(0), T = ids.size(1);
  if (B == 0 || T == 0) throw Error("DecoderLm::forward: empty input_ids");
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= config_.vocab_size)
    throw Error("DecoderLm::forward: token id " + std::to_string(lo < 0 ? lo : hi) + " outside the vocabulary [0, " +
                std::to_string(config_.vocab_size) + ")");
  const int64_t past = in.cache ? in.cache->length : 0, S = past + T;
  if (in.cache && S > in.cache->capacity)
    throw Error("DecoderLm::forward: the KV cache holds " + std::to_string(in.cache->capacity) + " slots, " +
                std::to_string(S) + " needed");
  if (in.cache) {
    const auto& g = impl_->geometry;
    const auto& k = in.cache->keys;
    if (int64_t(k.size()) != config_.num_hidden_layers || in.cache->values.size() != k.size() ||
        !k[0].sizes().equals({B, g.kv_heads, in.cache->capacity, g.head_dim}) || k[0].scalar_type() != options_.dtype)
      throw Error("DecoderLm::forward: the KV cache was made for another batch, model, TP size or dtype (use new_cache)");
  }
  if (in.position_ids.defined() && !in.position_ids.sizes().equals({B, T}))
    throw Error("DecoderLm::forward: position_ids must be [B, T] = [" + std::to_string(B) + ", " + std::to_string(T) + "]");
  if (in.attention_mask.defined() && (in.attention_mask.dim() != 2 || in.attention_mask.size(0) != B ||
                                      in.attention_mask.size(1) != S))
    throw Error("DecoderLm::forward: attention_mask must be [B, cached + new] = [" + std::to_string(B) + ", " +
                std::to_string(S) + "]");

  // Embedding: a vocabulary-parallel rank looks up the ids it holds, the others add zeros.
  torch::Tensor x;
  if (!tp.sharded()) {
    x = m.model->embed_tokens(ids);
  } else {
    const int64_t rows = m.model->embed_tokens->weight.size(0), begin = tp.rank * rows;
    auto mine = (ids >= begin).logical_and(ids < begin + rows);
    x = m.model->embed_tokens(torch::where(mine, ids - begin, torch::zeros_like(ids)));
    x = (x * mine.unsqueeze(-1).to(x.scalar_type())).contiguous();
    tp.all_reduce_sum(x);
  }

  // RoPE tables of these positions.
  auto positions = in.position_ids.defined() ? in.position_ids : torch::arange(past, S, torch::kLong).expand({B, T});
  auto freqs = positions.to(torch::kFloat).unsqueeze(-1) * impl_->inv_freq;  // [B, T, hd / 2]
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(options_.dtype).unsqueeze(1), sin = emb.sin().to(options_.dtype).unsqueeze(1);

  // Additive mask [B or 1, 1, 1, T, S]: causal over slots, padding keys off, the diagonal always on
  // (a padding query then attends to itself, so no row is all -inf).
  auto query_slot = torch::arange(past, S, torch::kLong).unsqueeze(1);  // [T, 1]
  auto key_slot = torch::arange(0, S, torch::kLong).unsqueeze(0);       // [1, S]
  auto allowed = (key_slot <= query_slot).unsqueeze(0);                 // [1, T, S]
  if (in.attention_mask.defined())
    allowed = allowed.logical_and(in.attention_mask.to(torch::kBool).unsqueeze(1)).logical_or((key_slot == query_slot).unsqueeze(0));
  auto bias = torch::zeros(allowed.sizes(), torch::kFloat)
                  .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity())
                  .unsqueeze(1)
                  .unsqueeze(1);

  for (size_t i = 0; i < m.model->layers->size(); ++i)
    x = m.model->layers[i]->as<DecoderLayerImpl>()->forward(x, cos, sin, bias, in.cache, i);
  if (in.cache) in.cache->length = S;
  if (in.last_only) x = x.narrow(1, T - 1, 1);
  x = m.model->norm(x);

  // The head's weight is used outside a holder's call (a tied head is the embedding's weight): it
  // is bracketed by hand, so a ZeRO-3 engine gathers the unit that owns it (unit_hooks.h).
  torch::nn::Module* owner = config_.tie_word_embeddings ? static_cast<torch::nn::Module*>(m.model->embed_tokens.get())
                                                         : static_cast<torch::nn::Module*>(m.lm_head.get());
  zero::UnitCall head_call(owner);
  const auto& head = config_.tie_word_embeddings ? m.model->embed_tokens->weight : m.lm_head->weight;
  auto projected = F::linear(x, head);
  head_call.finish({projected}, false);
  auto logits = projected.to(torch::kFloat);
  if (!tp.sharded()) return logits;
  // Vocabulary-parallel head: gather every rank's slice of the (padded) vocabulary.
  const auto Tq = logits.size(1), local = logits.size(2);
  auto gathered = tp.all_gather(logits.contiguous().view({-1}));
  return gathered.view({tp.size, B, Tq, local}).permute({1, 2, 0, 3}).reshape({B, Tq, tp.size * local})
      .narrow(2, 0, config_.vocab_size);
}

at::Tensor DecoderLm::loss(const at::Tensor& tokens, const at::Tensor& targets) const {
  auto logits = forward(tokens);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

void DecoderLm::check_weights(const io::WeightDirectory& weights) const { check_decoder_weights(config_, weights); }

void check_decoder_weights(const DecoderConfig& config, const io::WeightDirectory& weights) {
  auto where = [&](const std::string& name) { return weights.dir() + ": tensor '" + name + "'"; };
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape) {
    if (!weights.contains(name)) throw CheckpointError(where(name) + " is missing (a " + config.model_type() + " model needs it)");
    const auto& info = weights.info(name);
    if (info.dtype != io::StDtype::f32 && info.dtype != io::StDtype::bf16 && info.dtype != io::StDtype::f16)
      throw CheckpointError(where(name) + " is stored as " + io::dtype_name(info.dtype) +
                            "; weights must be F32, BF16 or F16");
    if (info.shape != shape)
      throw CheckpointError(where(name) + " has shape " + shape_text(info.shape) + ", the config needs " +
                            shape_text(shape));
  };
  // Every layer has tensors of its own: more layers than tensors cannot all be there, and the
  // first problem (in parameter order) lies within the first n + 1 layers. Checking those alone
  // keeps the list as short as the directory whatever num_hidden_layers says.
  const int64_t tensors = int64_t(weights.names().size());
  if (config.num_hidden_layers > tensors) {
    DecoderConfig first = config;
    first.num_hidden_layers = tensors + 1;
    for (const auto& [name, shape] : decoder_parameter_shapes(first)) check(name, shape);
  }
  // Check everything first: nothing is written when anything is wrong.
  std::set<std::string> expected;
  for (const auto& [name, shape] : decoder_parameter_shapes(config)) {
    expected.insert(name);
    check(name, shape);
  }
  bool tied_head_present = false;
  for (const auto& name : weights.names()) {
    if (expected.count(name)) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") {
      tied_head_present = true;
      continue;
    }
    throw CheckpointError(where(name) + " is not a parameter of this " + config.model_type() + " model" +
                          (ends_with(name, "rotary_emb.inv_freq") ? " (a RoPE buffer: remove it)" : ""));
  }
  if (tied_head_present) {
    auto head = weights.read("lm_head.weight"), embed = weights.read("model.embed_tokens.weight");
    if (!head.sizes().equals(embed.sizes()) || !torch::equal(head.to(torch::kFloat), embed.to(torch::kFloat)))
      throw CheckpointError(where("lm_head.weight") +
                            " differs from model.embed_tokens.weight but the config ties them (tie_word_embeddings)");
  }
}

void DecoderLm::load(const io::WeightDirectory& weights) {
  check_weights(weights);
  const auto& tp = options_.tp;
  const auto shapes = decoder_parameter_shapes(config_);
  torch::NoGradGuard no_grad;
  auto params = impl_->module->named_parameters();
  for (const auto& [name, shape] : shapes) {
    auto& param = *params.find(name);
    const auto shard = decoder_tp_shard(config_, name, tp.rank, tp.size);
    const bool whole = shard.dim < 0 || (tp.size == 1 && shard.length == shard.local_length);
    if (whole && io::to_scalar_type(weights.info(name).dtype) == param.scalar_type() && param.is_contiguous()) {
      weights.read_into(name, param);  // straight from the file into the parameter
      continue;
    }
    param.copy_(cut_shard(weights.read(name).to(options_.dtype), shard));
  }
}

void DecoderLm::save_pretrained(const std::string& dir, uint64_t max_shard_bytes) const {
  if (options_.tp.sharded())
    throw Error("DecoderLm::save_pretrained: a tensor-parallel shard cannot be saved alone (TP size " +
                std::to_string(options_.tp.size) + ")");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : impl_->module->named_parameters()) tensors.emplace_back(item.key(), item.value().detach());
  io::save_weight_directory(dir, tensors, max_shard_bytes);
  auto config = config_;
  config.torch_dtype = options_.dtype == at::kBFloat16 ? "bfloat16" : options_.dtype == at::kHalf ? "float16" : "float32";
  const std::string path = (std::filesystem::path(dir) / "config.json").string(), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << decoder_config_json(config);
    if (!out.flush()) throw CheckpointError(tmp + ": cannot write");
  }
  std::filesystem::rename(tmp, path);
}

DecoderLm load_pretrained(const std::string& dir, DecoderOptions options) {
  auto config = load_decoder_config(dir);
  io::WeightDirectory weights(dir);
  // The headers against the config before anything is allocated: a config.json far bigger than
  // its weights is an error naming a tensor, not an allocator failure.
  check_decoder_weights(config, weights);
  options.random_init = false;  // every parameter is read next
  DecoderLm model(config, std::move(options));
  model.load(weights);
  return model;
}

}  // namespace tessera::nn
