#!/usr/bin/env bash
# Installs the Debian packages tessera builds and tests with. Idempotent: when every package is
# present it does nothing (no apt-get update, no network). Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config python3   # python3 runs tessera-launch
  libtorch-dev libgloo-dev libopenblas0-pthread   # LibTorch 1.13 CPU; c10d Gloo headers; fast BLAS
  libcaf-dev                                      # C++ Actor Framework 0.17
  libucx-dev ucx-utils                            # UCX 1.13 (ucx_perftest for bench/)
  libtomlplusplus-dev nlohmann-json3-dev          # TOML and DeepSpeed JSON configs
  catch2                                          # Catch2 2.x tests
  libcli11-dev libspdlog-dev libfmt-dev           # command line, logging
  libxxhash-dev                                   # checksums
  liburing-dev                                    # io_uring: optimizer offload to NVMe
  libhwloc-dev                                    # the host optimizer's threads bound to the rank's cores
  libssl-dev                                      # HMAC-SHA256 of the store's handshake
  libbenchmark-dev                                # bench harness
  python3-torch                                   # the decoder logits oracle; the Python binding's torch
  python3-dev pybind11-dev                        # the Python binding (python/)
  openmpi-bin mpich                               # real mpirun launches (tests/transport/launchers_test.py)
  iproute2                                        # ip netns: the two-node sync test (tests/rollout/two_node_sync.py)
  python3-yaml                                    # Accelerate config files (tessera-launch --config_file)
  python3-matplotlib                              # the GRPO example's plot (examples/grpo/plot_grpo.py); optional at run time
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "install-deps: installing ${missing[*]}" >&2
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
