// The per-tensor digests a refused remote transfer compares (transport/affine/transfer_digests.h):
// the store encoding round-trips names with spaces and dots, and the comparison names the first
// tensor whose plan differs, a reordered batch and a shorter one. Hand-made lists are the oracle.
#include <catch2/catch.hpp>

#include "transport/affine/transfer_digests.h"

using namespace tessera::transport;

TEST_CASE("transfer digests: encoding round-trips; the first differing tensor is named", "[transport][digests]") {
  const TransferDigests a{{"model.embed_tokens.weight", 0x1}, {"model.layers.0.self_attn.q_proj.weight", 0xabcdef},
                          {"a name with spaces", 0xffffffffffffffffull}};
  CHECK(decode_transfer_digests(encode_transfer_digests(a)) == a);
  CHECK(first_differing_transfer(a, a).find("every tensor's plan is the same") != std::string::npos);

  auto b = a;
  b[1].second = 0x2;
  b[2].second = 0x3;
  const auto changed = first_differing_transfer(a, b);
  CHECK(changed.find("tensor 'model.layers.0.self_attn.q_proj.weight' is planned differently (transfer 1 of 3; "
                     "1 later transfers differ too") != std::string::npos);

  auto swapped = a;
  std::swap(swapped[0], swapped[1]);
  CHECK(first_differing_transfer(a, swapped).find("transfer 0 is tensor 'model.embed_tokens.weight' on the first") !=
        std::string::npos);

  const TransferDigests shorter(a.begin(), a.begin() + 2);
  CHECK(first_differing_transfer(a, shorter) == "the batches have 3 and 2 transfers");
}
