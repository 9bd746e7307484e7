// LibTorch and BLAS checks for `tessera doctor`.
#include <torch/torch.h>

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "tools/tessera/doctor/checks.h"

namespace tessera::cli::doctor {

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

namespace {
int collect_blas(dl_phdr_info* info, size_t, void* out) {
  std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.find("blas") != std::string::npos || name.find("mkl") != std::string::npos) {
    char resolved[PATH_MAX];
    auto* paths = static_cast<std::string*>(out);
    if (!paths->empty()) *paths += ", ";
    *paths += realpath(name.c_str(), resolved) ? resolved : name;
  }
  return 0;
}
}  // namespace

std::string blas_in_use() {
  // Make sure the BLAS is loaded (libtorch_cpu loads it lazily on the first GEMM on some builds).
  (void)torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  std::string paths;
  dl_iterate_phdr(collect_blas, &paths);
  std::string kind = "unknown BLAS";
  using config_fn = char* (*)();
  if (auto fn = reinterpret_cast<config_fn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    kind = fn();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  } else if (paths.find("/blas/") != std::string::npos) {
    kind = "reference BLAS (slow: install libopenblas0-pthread)";
  } else if (paths.find("mkl") != std::string::npos) {
    kind = "MKL";
  }
  return kind + (paths.empty() ? "" : " [" + paths + "]") + ", intra-op threads " +
         std::to_string(at::get_num_threads());
}

std::string check_libtorch_autograd() {
  // loss = sum((x w)^2) has gradient dL/dw = 2 x^T (x w); compare autograd with it.
  torch::manual_seed(0);
  auto x = torch::randn({8, 4});
  auto w = torch::randn({4, 3}, torch::requires_grad());
  auto loss = x.matmul(w).pow(2).sum();
  loss.backward();
  auto expected = 2 * x.t().matmul(x.matmul(w.detach()));
  if (!torch::allclose(w.grad(), expected, 1e-5, 1e-6))
    throw std::runtime_error("autograd gradient differs from the closed form 2 x^T (x w)");
  return "backward of sum((x w)^2) matches 2 x^T (x w)";
}

}  // namespace tessera::cli::doctor
