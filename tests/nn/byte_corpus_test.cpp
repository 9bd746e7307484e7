// ByteCorpus: batches are a pure function of (seed, step, micro), and rank shards concatenate
// to the single-process batch.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include "core/data/byte_corpus.h"
#include "core/error.h"

using tessera::data::ByteCorpus;

TEST_CASE("Rank shards concatenate to the global batch", "[data]") {
  ByteCorpus corpus(ByteCorpus::default_paths());
  CHECK(corpus.size_bytes() > 100000);
  auto whole = corpus.batch(9, 3, 1, 12, 64);
  CHECK(whole.tokens.sizes() == torch::IntArrayRef({12, 64}));
  CHECK(torch::equal(whole.tokens.narrow(1, 1, 63), whole.targets.narrow(1, 0, 63)));
  for (int world : {2, 3, 4}) {
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(corpus.batch(9, 3, 1, 12, 64, r, world).tokens);
    CHECK(torch::equal(torch::cat(parts), whole.tokens));
  }
  CHECK(torch::equal(corpus.batch(9, 3, 1, 12, 64).tokens, whole.tokens));
  CHECK_FALSE(torch::equal(corpus.batch(9, 3, 2, 12, 64).tokens, whole.tokens));
  CHECK_FALSE(torch::equal(corpus.batch(10, 3, 1, 12, 64).tokens, whole.tokens));
}

TEST_CASE("Corpus errors name the path or the arithmetic", "[data]") {
  CHECK_THROWS_WITH(ByteCorpus({"/nonexistent/corpus.txt"}), Catch::Contains("/nonexistent/corpus.txt"));
  ByteCorpus corpus(ByteCorpus::default_paths());
  CHECK_THROWS_WITH(corpus.batch(1, 0, 0, 10, 64, 0, 4), Catch::Contains("global batch 10"));
  const std::string tiny = "/tmp/tessera_tiny_corpus.txt";
  std::ofstream(tiny) << "abc";
  ByteCorpus small({tiny});
  CHECK_THROWS_WITH(small.batch(1, 0, 0, 1, 64), Catch::Contains("shorter than one window"));
}
