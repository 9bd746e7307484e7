// The digest the DeepSpeed fixtures' README defines: the first 16 hex digits of the SHA-256 over
// the parameters' float32 bytes, in model order (OpenSSL's EVP, as DeepSpeed's driver used hashlib).
#pragma once

#include <openssl/evp.h>

#include <string>
#include <utility>
#include <vector>

namespace tessera::testing {

inline std::string fixture_digest(const std::vector<std::pair<const void*, size_t>>& float32_tensors) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const auto& [data, bytes] : float32_tensors) EVP_DigestUpdate(ctx, data, bytes);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < 8; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

}  // namespace tessera::testing
