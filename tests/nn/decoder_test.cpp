// DecoderLm without an outside oracle: config.json parsing and refusals, Hugging Face names and
// counts, the TP split (shards reassemble the whole; KV replicas), weight loading (round trip,
// every refusal before anything is written), KV cache vs full recompute, padding.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <future>

#include <limits>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/affine/builders.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/affine/validate.h"
#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/io/weight_directory.h"
#include "core/nn/decoder.h"
#include "core/nn/tp_maps.h"
#include "tests/nn/decoder_models.h"

namespace fs = std::filesystem;
using namespace tessera::nn;
using tessera::nn::testing::family_config;
using tessera::nn::testing::family_configs;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("tessera_decoder_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::map<std::string, torch::Tensor> parameters_of(const DecoderLm& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : m.module()->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

}  // namespace

TEST_CASE("config.json of the three families: values, defaults, round trip", "[nn][decoder]") {
  auto llama = family_config("llama");
  CHECK(llama.family == DecoderFamily::llama);
  CHECK(llama.head_dim == 16);  // explicit, != 48 / 4
  CHECK(llama.eos_token_ids == std::vector<int64_t>{2});
  CHECK(llama.qkv_bias);
  CHECK(llama.o_bias);
  CHECK(llama.mlp_bias);
  auto qwen2 = family_config("qwen2");
  CHECK(qwen2.head_dim == 8);
  CHECK(qwen2.qkv_bias);
  CHECK_FALSE(qwen2.o_bias);
  CHECK(qwen2.tie_word_embeddings);
  auto qwen3 = family_config("qwen3");
  CHECK(qwen3.qk_norm);
  CHECK(qwen3.eos_token_ids == std::vector<int64_t>{2, 5});
  for (const auto& [family, text] : family_configs()) {
    auto c = parse_decoder_config(text, "x");
    auto again = parse_decoder_config(decoder_config_json(c), "again");
    CHECK(decoder_config_json(again) == decoder_config_json(c));
    DecoderLm model(c);
    int64_t total = 0;
    for (const auto& p : model.module()->parameters()) total += p.numel();
    CHECK(total == decoder_parameter_count(c));
  }
  // transformers' defaults where a key is absent.
  auto minimal = parse_decoder_config(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 16,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 32})", "m");
  CHECK(minimal.head_dim == 128);
  CHECK(minimal.num_key_value_heads == 32);
  CHECK(minimal.rope_theta == 10000.0);
  CHECK(minimal.max_position_embeddings == 32768);
  // Qwen2 takes an explicit head_dim too (transformers reads it when present).
  auto qwen2_head = parse_decoder_config(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 16,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12})", "q");
  CHECK(qwen2_head.head_dim == 12);
  CHECK(parse_decoder_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "dtype": "bfloat16",
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})", "d").torch_dtype == "bfloat16");
}

TEST_CASE("Keys tessera does not implement are refused by name, not ignored", "[nn][decoder]") {
  const auto& text = family_configs()[0].second;
  auto refused = [&](const std::string& changed, const std::string& needle) {
    INFO(changed);
    TESSERA_CHECK_THROWS(parse_decoder_config(changed, "dir/config.json"), tessera::ConfigError,
                         Catch::Matchers::Contains("dir/config.json") && Catch::Matchers::Contains(needle));
  };
  refused(replace(text, R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
          "rope_scaling");
  refused(replace(text, R"("hidden_act": "silu")", R"("hidden_act": "gelu")"), "hidden_act");
  refused(replace(text, R"("pretraining_tp": 1)", R"("pretraining_tp": 2)"), "pretraining_tp");
  refused(replace(text, R"("attention_dropout": 0.0)", R"("attention_dropout": 0.1)"), "attention_dropout");
  refused(replace(text, R"("use_cache": true)", R"("use_cache": true, "quantization_config": {})"), "quantization_config");
  refused(replace(text, R"("model_type": "llama")", R"("model_type": "mistral")"), "model_type");
  refused(replace(text, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)"), "num_key_value_heads");
  refused(replace(text, R"("head_dim": 16)", R"("head_dim": 15)"), "head_dim");
  refused(replace(text, R"("vocab_size": 97)", R"("vocab_size": "97")"), "vocab_size");
  refused(replace(text, R"("eos_token_id": 2)", R"("eos_token_id": 200)"), "eos_token_id");
  refused("{not json", "JSON");
  const auto& qwen2 = family_configs()[1].second;
  refused(replace(qwen2, R"("use_sliding_window": false)", R"("use_sliding_window": true)"), "use_sliding_window");
  refused(replace(qwen2, R"("hidden_act": "silu")", R"("hidden_act": "silu", "attention_bias": false)"),
          "attention_bias: false, but Qwen2's q/k/v projections always have a bias");
  refused(replace(qwen2, R"("hidden_act": "silu")", R"("hidden_act": "silu", "attention_bias": "yes")"),
          "attention_bias: expected true or false");
}

TEST_CASE("Qwen2 with attention_bias true (as some exports write it): the q/k/v biases, none on o", "[nn][decoder]") {
  const auto& qwen2 = family_configs()[1].second;
  const auto c = parse_decoder_config(replace(qwen2, R"("hidden_act": "silu")", R"("hidden_act": "silu", "attention_bias": true)"),
                                      "dir/config.json");
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.o_bias);
  // The same model as without the key (Qwen2 configs are written back without it).
  CHECK(decoder_config_json(c) == decoder_config_json(parse_decoder_config(qwen2, "dir/config.json")));
}

TEST_CASE("TP shards of every weight reassemble the whole model; KV heads replicated past KV", "[nn][decoder][tp]") {
  for (const auto& [family, text] : family_configs()) {
    const auto c = parse_decoder_config(text, family);
    DecoderLm whole(c);
    const auto full = parameters_of(whole);
    for (int tp : {2, 4}) {
      INFO(family << " at TP " << tp);
      check_tp_size(c, tp);
      std::vector<std::map<std::string, torch::Tensor>> ranks;
      for (int r = 0; r < tp; ++r) {
        DecoderOptions o;
        o.tp.rank = r, o.tp.size = tp;
        o.tp.all_reduce_sum = [](at::Tensor&) {};
        o.tp.all_gather = [](const at::Tensor& t) { return t; };
        o.tp.broadcast = [](at::Tensor&) {};
        ranks.push_back(parameters_of(DecoderLm(c, o)));  // random init: drawn whole, then cut
      }
      for (const auto& [name, tensor] : full) {
        INFO(name);
        const auto shard = decoder_tp_shard(c, name, 0, tp);
        if (shard.dim < 0) {
          for (int r = 0; r < tp; ++r) CHECK(torch::equal(ranks[r].at(name), tensor));
          continue;
        }
        // Distinct slices in rank order, replicas (same begin) skipped, padding rows zero.
        std::vector<torch::Tensor> pieces;
        int64_t last_begin = -1;
        for (int r = 0; r < tp; ++r) {
          const auto s = decoder_tp_shard(c, name, r, tp);
          const auto& local = ranks[r].at(name);
          CHECK(local.size(s.dim) == s.local_length);
          if (s.local_length > s.length)
            CHECK(torch::equal(local.narrow(s.dim, s.length, s.local_length - s.length),
                               torch::zeros_like(local.narrow(s.dim, s.length, s.local_length - s.length))));
          if (s.begin == last_begin) {
            CHECK(torch::equal(local, ranks[r - 1].at(name)));
            continue;
          }
          last_begin = s.begin;
          pieces.push_back(local.narrow(s.dim, 0, s.length));
        }
        CHECK(torch::equal(torch::cat(pieces, shard.dim), tensor));
      }
    }
  }
  auto qwen2 = family_config("qwen2");  // one KV head: every rank of TP 4 holds it
  for (int r = 0; r < 4; ++r) CHECK(decoder_tp_shard(qwen2, "model.layers.0.self_attn.k_proj.weight", r, 4).begin == 0);
  auto llama = family_config("llama");  // 2 KV heads at TP 4: ranks 0,1 -> head 0; 2,3 -> head 1
  CHECK(decoder_tp_shard(llama, "model.layers.1.self_attn.v_proj.weight", 1, 4).begin == 0);
  CHECK(decoder_tp_shard(llama, "model.layers.1.self_attn.v_proj.weight", 2, 4).begin == 16);
  CHECK(padded_vocab_size(llama, 4) == 100);
  TESSERA_CHECK_THROWS(check_tp_size(llama, 3), tessera::ConfigError, Catch::Matchers::Contains("num_attention_heads"));
  auto uneven = family_config("qwen3");
  uneven.intermediate_size = 50;
  TESSERA_CHECK_THROWS(check_tp_size(uneven, 4), tessera::ConfigError, Catch::Matchers::Contains("intermediate_size"));
}

TEST_CASE("save_pretrained / load_pretrained round trip bitwise, single file and sharded, bf16", "[nn][decoder][io]") {
  for (const auto& [family, text] : family_configs()) {
    INFO(family);
    const auto c = parse_decoder_config(text, family);
    DecoderOptions o;
    o.seed = 77;
    DecoderLm model(c, o);
    for (uint64_t shard_bytes : {uint64_t(0), uint64_t(20000)}) {
      TempDir dir;
      model.save_pretrained(dir.path.string(), shard_bytes);
      CHECK(fs::exists(dir / (shard_bytes ? "model.safetensors.index.json" : "model.safetensors")));
      CHECK(load_decoder_config(dir.path.string()).vocab_size == c.vocab_size);
      auto loaded = load_pretrained(dir.path.string());
      auto a = parameters_of(model), b = parameters_of(loaded);
      REQUIRE(a.size() == b.size());
      for (const auto& [name, t] : a) CHECK(torch::equal(t, b.at(name)));
    }
    // bf16 on disk into an fp32 model: the bf16 values, exactly.
    DecoderOptions bf16 = o;
    bf16.dtype = at::kBFloat16;
    DecoderLm narrow(c, bf16);
    TempDir dir;
    narrow.save_pretrained(dir.path.string());
    CHECK(load_decoder_config(dir.path.string()).torch_dtype == "bfloat16");
    auto widened = load_pretrained(dir.path.string());
    for (const auto& item : narrow.module()->named_parameters())
      CHECK(torch::equal(item.value().to(at::kFloat), widened.module()->named_parameters()[item.key()]));
  }
}

TEST_CASE("Weights of another shape or name are refused before any parameter changes", "[nn][decoder][io]") {
  const auto c = family_config("qwen3");
  DecoderLm source(c);
  TempDir dir;
  auto tensors = std::vector<std::pair<std::string, at::Tensor>>();
  for (const auto& item : source.module()->named_parameters()) tensors.emplace_back(item.key(), item.value().detach());
  auto write_with = [&](std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)> change) {
    auto copy = tensors;
    change(copy);
    fs::remove_all(dir.path);
    tessera::io::save_weight_directory(dir.path.string(), copy);
  };
  DecoderOptions o;
  o.seed = 5;
  DecoderLm target(c, o);
  const auto before = parameters_of(target);
  auto refused = [&](const std::string& needle) {
    tessera::io::WeightDirectory weights(dir.path.string());
    TESSERA_CHECK_THROWS(target.load(weights), tessera::CheckpointError,
                         Catch::Matchers::Contains(dir.path.string()) && Catch::Matchers::Contains(needle));
    for (const auto& [name, t] : parameters_of(target)) CHECK(torch::equal(t, before.at(name)));
  };
  write_with([](auto& t) { t.erase(t.begin() + 3); });
  refused(tensors[3].first + "' is missing");
  write_with([](auto& t) { t[5].second = torch::zeros({7, 3}); });
  refused(tensors[5].first + "' has shape [7, 3]");
  write_with([](auto& t) { t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::zeros({6})); });
  refused("rotary_emb.inv_freq' is not a parameter");
  write_with([](auto& t) { t.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({4, 4})); });
  refused("model.layers.9.mlp.up_proj.weight' is not a parameter");
  write_with([](auto& t) { t[2].second = t[2].second.to(torch::kLong); });
  refused(tensors[2].first + "' is stored as I64");

  // A tied model takes an lm_head.weight only when it is the embedding.
  const auto tied = family_config("qwen2");
  DecoderLm tied_model(tied);
  std::vector<std::pair<std::string, at::Tensor>> tied_tensors;
  for (const auto& item : tied_model.module()->named_parameters()) tied_tensors.emplace_back(item.key(), item.value().detach());
  tied_tensors.emplace_back("lm_head.weight", tied_model.module()->named_parameters()["model.embed_tokens.weight"].clone());
  fs::remove_all(dir.path);
  tessera::io::save_weight_directory(dir.path.string(), tied_tensors);
  DecoderLm other(tied, o);
  other.load(tessera::io::WeightDirectory(dir.path.string()));
  tied_tensors.back().second.add_(1);
  fs::remove_all(dir.path);
  tessera::io::save_weight_directory(dir.path.string(), tied_tensors);
  TESSERA_CHECK_THROWS(other.load(tessera::io::WeightDirectory(dir.path.string())), tessera::CheckpointError,
                       Catch::Matchers::Contains("tie_word_embeddings"));
}

TEST_CASE("load_pretrained checks the weights against config.json before allocating the model", "[nn][decoder][io]") {
  // A config.json far bigger than its weights: 2^40 tokens x d would be 2^40 x d x 4 bytes to
  // allocate; the error names the tensor and both shapes instead.
  const auto c = family_config("qwen3");
  TempDir dir;
  DecoderLm(c).save_pretrained(dir.path.string());
  auto big = c;
  big.vocab_size = int64_t(1) << 40;
  std::ofstream(dir / "config.json", std::ios::trunc) << decoder_config_json(big);
  const std::string d = std::to_string(c.hidden_size);
  TESSERA_CHECK_THROWS(load_pretrained(dir.path.string()), tessera::CheckpointError,
                       Catch::Matchers::Contains("tensor 'model.embed_tokens.weight' has shape [" +
                                                 std::to_string(c.vocab_size) + ", " + d + "]") &&
                           Catch::Matchers::Contains("the config needs [1099511627776, " + d + "]"));
}

TEST_CASE("check_decoder_weights names the first missing layer without listing 2^40 of them", "[nn][decoder][io]") {
  const auto c = family_config("qwen3");
  TempDir dir;
  DecoderLm(c).save_pretrained(dir.path.string());
  auto deep = c;
  deep.num_hidden_layers = int64_t(1) << 40;
  const tessera::io::WeightDirectory weights(dir.path.string());
  TESSERA_CHECK_THROWS(check_decoder_weights(deep, weights), tessera::CheckpointError,
                       Catch::Matchers::Contains("tensor 'model.layers." + std::to_string(c.num_hidden_layers) + ".") &&
                           Catch::Matchers::Contains("is missing"));
  CHECK_NOTHROW(check_decoder_weights(c, weights));
}

TEST_CASE("A FIFO in place of config.json is refused at once, by name", "[nn][decoder][io]") {
  TempDir dir;
  const std::string fifo = (dir.path / "config.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto reading = std::async(std::launch::async, [&]() -> std::string {
    try {
      load_decoder_config(dir.path.string());
    } catch (const tessera::ConfigError& e) {
      return e.what();
    }
    return "";
  });
  if (reading.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    FAIL_CHECK("blocked opening " << fifo);
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets a blocked open() return
    reading.wait();
    if (fd >= 0) ::close(fd);
  }
  CHECK_THAT(reading.get(), Catch::Matchers::Contains(fifo) && Catch::Matchers::Contains("not a regular file"));
}

TEST_CASE("KV cache steps equal the full recompute; padded rows equal the rows alone", "[nn][decoder]") {
  for (const auto& [family, text] : family_configs()) {
    INFO(family);
    const auto c = parse_decoder_config(text, family);
    DecoderOptions o;
    o.init_std = 0.1;
    DecoderLm model(c, o);
    torch::NoGradGuard no_grad;
    auto ids = torch::randint(0, c.vocab_size, {3, 12}, torch::kLong);
    auto full = model.forward(ids);
    auto cache = model.new_cache(3, 12);
    auto prefill = model.forward(ids.narrow(1, 0, 5), {torch::Tensor(), torch::Tensor(), &cache});
    CHECK(torch::allclose(prefill, full.narrow(1, 0, 5), 1e-5, 1e-5));
    for (int64_t t = 5; t < 12; ++t) {
      auto step = model.forward(ids.narrow(1, t, 1), {torch::Tensor(), torch::Tensor(), &cache});
      CHECK((step.squeeze(1) - full.select(1, t)).abs().max().item<double>() < 1e-5);
    }
    CHECK(cache.length == 12);
    CHECK_THROWS_AS(model.forward(ids.narrow(1, 0, 1), {torch::Tensor(), torch::Tensor(), &cache}), tessera::Error);
    // Row 1 left-padded by 4 (garbage ids under mask 0) equals its 8 tokens run alone.
    auto padded = ids.clone();
    auto mask = torch::ones({3, 12}, torch::kLong);
    mask[1].narrow(0, 0, 4).fill_(0);
    auto positions = (mask.cumsum(1) - 1).clamp_min(0);
    auto logits = model.forward(padded, {positions, mask});
    auto alone = model.forward(ids[1].narrow(0, 4, 8).unsqueeze(0));
    CHECK((logits[1].narrow(0, 4, 8) - alone[0]).abs().max().item<double>() < 1e-5);
    CHECK(torch::isfinite(logits).all().item<bool>());
    // Token ids outside the vocabulary are an error, not a read out of bounds.
    auto bad = ids.clone();
    bad[0][0] = c.vocab_size;
    TESSERA_CHECK_THROWS(model.forward(bad), tessera::Error, Catch::Matchers::Contains("outside the vocabulary"));
  }
}

TEST_CASE("TP storage maps are valid and move a whole model into exactly each rank's cut", "[nn][decoder][tp][affine]") {
  for (const auto& [family, text] : family_configs()) {
    const auto c = parse_decoder_config(text, family);
    DecoderLm whole(c);
    testing::randomize_norms_and_biases(whole.module(), 3);
    const auto full = parameters_of(whole);
    for (int tp : {1, 2, 4}) {
      INFO(family << " TP " << tp);
      for (const auto& [name, tensor] : full) {
        INFO(name);
        const auto map = decoder_tp_map(c, name, tp, tessera::affine::DType::f32);
        tessera::affine::validate_map(map);
        // Oracle: cut_shard of the whole tensor. Targets start as NaN; padding rows stay NaN (outside the map).
        const auto source = tessera::affine::replicated({name, tessera::affine::DType::f32, map.shape}, 1);
        const auto plan = tessera::affine::plan(map, source);
        std::vector<torch::Tensor> locals;
        tessera::affine::LocalTransfer t;
        t.plan = &plan;
        auto src = tensor.contiguous();
        t.source_buffers[0] = {src.data_ptr(), src.numel(), tessera::affine::DType::f32};
        for (int r = 0; r < tp; ++r) {
          const auto s = decoder_tp_shard(c, name, r, tp);
          auto local = cut_shard(tensor, s).fill_(std::numeric_limits<float>::quiet_NaN());
          locals.push_back(local);
          t.target_buffers[r] = {local.data_ptr(), local.numel(), tessera::affine::DType::f32};
        }
        tessera::affine::execute_local({t});
        for (int r = 0; r < tp; ++r) {
          const auto s = decoder_tp_shard(c, name, r, tp);
          auto expected = cut_shard(tensor, s), got = locals[size_t(r)];
          if (s.dim >= 0 && s.local_length > s.length) {
            CHECK(torch::isnan(got.narrow(s.dim, s.length, s.local_length - s.length)).all().item<bool>());
            expected = expected.narrow(s.dim, 0, s.length), got = got.narrow(s.dim, 0, s.length);
          }
          CHECK(torch::equal(got, expected));
        }
      }
    }
  }
  // Negative control: two ranks' k_proj pieces swapped (each claims the other's heads) is still a
  // valid map, so only the cut oracle can tell: it must.
  const auto c = family_config("llama");
  const std::string name = "model.layers.0.self_attn.k_proj.weight";
  auto map = decoder_tp_map(c, name, 2, tessera::affine::DType::f32);
  std::swap(map.ranks[0].pieces[0].box, map.ranks[1].pieces[0].box);
  tessera::affine::validate_map(map);
  auto tensor = torch::randn({c.kv_width(), c.hidden_size});
  const auto plan = tessera::affine::plan(map, tessera::affine::replicated({name, tessera::affine::DType::f32, map.shape}, 1));
  tessera::affine::LocalTransfer t;
  t.plan = &plan;
  t.source_buffers[0] = {tensor.data_ptr(), tensor.numel(), tessera::affine::DType::f32};
  auto local = torch::empty({c.kv_width() / 2, c.hidden_size});
  t.target_buffers[0] = {local.data_ptr(), local.numel(), tessera::affine::DType::f32};
  auto other = torch::empty_like(local);
  t.target_buffers[1] = {other.data_ptr(), other.numel(), tessera::affine::DType::f32};
  tessera::affine::execute_local({t});
  CHECK_FALSE(torch::equal(local, cut_shard(tensor, decoder_tp_shard(c, name, 0, 2))));
}
