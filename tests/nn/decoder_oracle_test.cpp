// The logits oracle: DecoderLm's logits (fp32) against tests/nn/reference_decoder.py, an
// independent float64 implementation of the same equations in plain PyTorch (Debian's
// python3-torch), on random models written as Hugging Face directories, for each family; with
// left padding; with bf16 weights on disk; and a negative control (one changed weight must fail).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/nn/decoder.h"
#include "tests/nn/decoder_models.h"

namespace fs = std::filesystem;
using namespace tessera::nn;

namespace {

struct Case {
  fs::path dir;
  torch::Tensor ids, mask;
};

// Writes the model and the inputs, runs the reference, returns its logits [B, T, V].
torch::Tensor reference_logits(const Case& c) {
  tessera::io::write_safetensors((c.dir / "inputs.safetensors").string(), {{"input_ids", c.ids}, {"attention_mask", c.mask}});
  const auto out = c.dir / "reference.safetensors";
  const std::string command = std::string("'") + TESSERA_TORCH_PYTHON + "' '" + TESSERA_REFERENCE_DECODER + "' '" +
                              c.dir.string() + "' '" + (c.dir / "inputs.safetensors").string() + "' '" + out.string() + "'";
  const int status = std::system(command.c_str());
  INFO("reference: " << command);
  INFO("needs Debian's python3-torch for " TESSERA_TORCH_PYTHON " (tools/install-deps.sh installs it)");
  REQUIRE(status == 0);
  return tessera::io::SafetensorsFile(out.string()).read("logits");
}

// Largest |difference| over real (mask 1) positions, relative to the largest reference logit.
double relative_error(const torch::Tensor& logits, const torch::Tensor& reference, const torch::Tensor& mask) {
  auto real = mask.to(torch::kBool).unsqueeze(-1).expand_as(reference);
  auto diff = (logits - reference).abs().masked_select(real).max().item<double>();
  return diff / std::max(1.0, reference.abs().max().item<double>());
}

Case make_case(const std::string& name, int64_t vocab) {
  Case c;
  c.dir = fs::temp_directory_path() / ("tessera_oracle_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(c.dir);
  torch::manual_seed(11);
  c.ids = torch::randint(0, vocab, {3, 14}, torch::kLong);
  c.mask = torch::ones({3, 14}, torch::kLong);
  c.mask[1].narrow(0, 0, 5).fill_(0);   // left padding
  c.mask[2].narrow(0, 0, 13).fill_(0);  // a one-token prompt
  return c;
}

torch::Tensor forward(const DecoderLm& model, const Case& c) {
  torch::NoGradGuard no_grad;
  return model.forward(c.ids, {(c.mask.cumsum(1) - 1).clamp_min(0), c.mask});
}

}  // namespace

TEST_CASE("Logits equal the float64 PyTorch reference for Llama, Qwen2 and Qwen3", "[nn][decoder][oracle]") {
  for (const auto& [family, text] : testing::family_configs()) {
    INFO(family);
    const auto config = parse_decoder_config(text, family);
    DecoderOptions options;
    options.init_std = 0.2;  // logits well away from uniform: a sharper comparison
    options.seed = 3;
    DecoderLm model(config, options);
    testing::randomize_norms_and_biases(model.module(), 4);
    auto c = make_case(family, config.vocab_size);
    model.save_pretrained(c.dir.string());
    auto reference = reference_logits(c);
    auto logits = forward(model, c);
    REQUIRE(reference.sizes() == logits.sizes());
    const double error = relative_error(logits, reference, c.mask);
    std::printf("oracle %s: max |logit - reference| / max |reference| = %.3g (largest logit %.3g)\n", family.c_str(),
                error, reference.abs().max().item<double>());
    CHECK(error < 2e-5);

    // Negative controls: one changed element of the last layer's v_proj, of a norm weight, of a bias.
    for (const std::string name : {"model.layers.1.self_attn.v_proj.weight", "model.layers.0.post_attention_layernorm.weight",
                                   "model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_norm.weight"}) {
      auto params = model.module()->named_parameters();
      if (!params.contains(name)) continue;
      INFO(name);
      auto p = params[name];
      const auto saved = p.detach().clone();
      {
        torch::NoGradGuard no_grad;
        p.view({-1})[0].add_(0.05);
      }
      CHECK(relative_error(forward(model, c), reference, c.mask) > 1e-4);
      torch::NoGradGuard no_grad;
      p.copy_(saved);
    }
    fs::remove_all(c.dir);
  }
}

TEST_CASE("bf16 weights on disk: the fp32 model of the loaded values equals the reference", "[nn][decoder][oracle]") {
  const auto config = testing::family_config("qwen3");
  DecoderOptions bf16;
  bf16.dtype = at::kBFloat16;
  bf16.init_std = 0.2;
  auto c = make_case("bf16", config.vocab_size);
  DecoderLm narrow(config, bf16);
  testing::randomize_norms_and_biases(narrow.module(), 5);
  narrow.save_pretrained(c.dir.string());
  auto model = load_pretrained(c.dir.string());  // fp32 model of the bf16 values
  const double error = relative_error(forward(model, c), reference_logits(c), c.mask);
  std::printf("oracle qwen3 (bf16 weights): relative error %.3g\n", error);
  CHECK(error < 2e-5);
  fs::remove_all(c.dir);
}
