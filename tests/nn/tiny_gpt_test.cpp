// TinyGpt: parameter count from the closed form, causality, determinism, and that it learns.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "core/data/byte_corpus.h"
#include "core/nn/tiny_gpt.h"

using tessera::nn::GptConfig;
using tessera::nn::TinyGpt;

TEST_CASE("Parameter count matches the closed form and names follow GPT-2", "[nn]") {
  GptConfig c;
  TinyGpt model(c);
  int64_t total = 0;
  for (auto& p : model.module()->parameters()) total += p.numel();
  CHECK(total == tessera::nn::gpt_parameter_count(c));
  CHECK(total == 3314176);  // 65536 + 32768 + 4 * 787456 + 512 + 65536, derived from the shapes
  c.bias = true;
  int64_t with_bias = 0;
  for (auto& p : TinyGpt(c).module()->parameters()) with_bias += p.numel();
  CHECK(with_bias == tessera::nn::gpt_parameter_count(c));
  CHECK(with_bias == 3323392);  // + 4 * (768 + 256 + 1024 + 256)
  auto named = model.module()->named_parameters();
  CHECK(named.contains("h.0.attn.c_attn.weight"));
  CHECK(named.contains("h.3.ln_2.bias"));
  CHECK_FALSE(named.contains("h.3.mlp.c_proj.bias"));
  CHECK(named.contains("lm_head.weight"));
}

TEST_CASE("Logits at position t do not depend on tokens after t", "[nn]") {
  GptConfig c;
  c.d_model = 32, c.n_layer = 2, c.n_head = 4, c.context = 16;
  TinyGpt model(c);
  auto tokens = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto changed = tokens.clone();
  changed.index_put_({torch::indexing::Slice(), torch::indexing::Slice(10)}, 7);
  auto a = model.forward(tokens), b = model.forward(changed);
  CHECK(torch::equal(a.narrow(1, 0, 10), b.narrow(1, 0, 10)));
  CHECK_FALSE(torch::equal(a.narrow(1, 10, 6), b.narrow(1, 10, 6)));
}

TEST_CASE("Same seed, same weights; the model learns the corpus", "[nn]") {
  GptConfig c;
  c.d_model = 64, c.n_layer = 2, c.n_head = 4, c.context = 32;
  TinyGpt a(c), b(c);
  auto pa = a.module()->named_parameters(), pb = b.module()->named_parameters();
  for (auto& item : pa) CHECK(torch::equal(item.value(), pb[item.key()]));

  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());
  torch::optim::AdamW opt(a.module()->parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto batch = corpus.batch(1, step, 0, 16, c.context);
    auto loss = a.loss(batch.tokens, batch.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  // ln(256) = 5.55 at the start; byte frequencies alone bring English text below 3.5.
  CHECK(first == Approx(std::log(256.0)).epsilon(0.05));
  CHECK(last < 3.5);
}
