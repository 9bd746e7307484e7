#!/usr/bin/env bash
# Builds the transport's NCCL path and tests/transport/nccl_test.cpp on a GPU machine that has
# PyTorch (its LibTorch), CUDA and NCCL but none of Debian's packages, then runs the test through
# tessera-launch: 1 rank (every collective against the CPU oracle), then 2 ranks sharing GPU 0
# (NCCL runs them or refuses by name; nobody hangs), and an initialisation that rank 1 never
# joins (rank 0 times out). Gloo is left out (gloo_unavailable.cpp).
# Needs .device/ from prepare_carry.sh. Logs go to $OUT (or /tmp/nccl_check).
#   usage: tools/device/nccl_check.sh            (in the repository root)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/nccl_check}
build=/tmp/nccl_check_build
rm -rf "$build" && mkdir -p "$out" "$build"
cd "$root"
py=${PYTHON:-python3}

# TORCH_PREFIX (include/ and lib/ of a LibTorch) and TORCH_ABI override what python3's torch says;
# TORCH_EXTRA_LIBS adds libraries that LibTorch needs (Debian's: -lglog).
torch=${TORCH_PREFIX:-$($py -c 'import torch, os; print(os.path.dirname(torch.__file__))')}
abi=${TORCH_ABI:-$($py -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')}
find_first() {  # find_first <file> <dir>...: the first dir holding <file> (searched 4 levels down)
  local name=$1; shift
  for d in "$@"; do
    [ -d "$d" ] || continue
    local hit
    hit=$(find -H "$d" -maxdepth 4 -name "$name" 2>/dev/null | head -1)
    [ -n "$hit" ] && { dirname "$hit"; return 0; }
  done
  return 1
}
site=$($py -c 'import site; print(site.getsitepackages()[0])')
cuda_inc=$(find_first cuda_runtime.h /usr/local/cuda/include /usr/local/cuda "$site/nvidia" /usr/include) || { echo "no cuda_runtime.h"; exit 2; }
nccl_inc=$(find_first nccl.h "$site/nvidia/nccl" /usr/local/cuda/include /usr/include "$site/nvidia") || { echo "no nccl.h"; exit 2; }
nccl_lib=$(find_first libnccl.so.2 "$site/nvidia/nccl" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu) || { echo "no libnccl.so.2"; exit 2; }
cudart_lib=$(find_first 'libcudart.so.[0-9]*' "$site/nvidia" "$torch/lib" /usr/local/cuda/lib64) || { echo "no libcudart"; exit 2; }
cudart=$(ls "$cudart_lib"/libcudart.so.[0-9]* | head -1)
crypto=/usr/lib/x86_64-linux-gnu/libcrypto.so.3
[ -e "$crypto" ] || crypto=$root/.device/lib/libcrypto.so.3
{
  echo "torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null) at $torch (cxx11 abi $abi)"
  echo "cuda headers $cuda_inc; nccl $nccl_inc, $nccl_lib; cudart $cudart; crypto $crypto"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  g++ --version | head -1
} | tee "$out/environment.txt"

sources=(transport/store.cpp transport/rendezvous/store_protocol.cpp transport/rendezvous/store_server.cpp
  transport/rendezvous/store_client.cpp transport/communicator.cpp transport/liveness.cpp
  transport/detail/sequencer.cpp transport/detail/arrival_recorder.cpp transport/nccl/nccl_backend.cpp
  transport/nccl/nccl_info.cpp tools/device/gloo_unavailable.cpp tests/transport/nccl_test.cpp)
compile() {  # compile <c++ standard>: every source in parallel; 0 when all compiled
  local std=$1
  printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} sh -c '
    o='"$build"'/$(echo {} | tr / _).o
    g++ -std='"$std"' -O2 -fPIC -DTESSERA_WITH_CUDA -D_GLIBCXX_USE_CXX11_ABI='"$abi"' \
      -I'"$root"' -I'"$root"'/.device/include -I'"$torch"'/include -I'"$torch"'/include/torch/csrc/api/include \
      -isystem '"$cuda_inc"' -isystem '"$nccl_inc"' -c {} -o "$o" 2>"$o.log" || { echo "FAILED {}"; head -c 3000 "$o.log"; exit 1; }'
}
start=$(date +%s)
if ! compile c++17 > "$out/compile.log" 2>&1; then
  echo "c++17 failed (see compile.log); trying c++20"
  compile c++20 > "$out/compile20.log" 2>&1 || { echo "compile failed:"; head -c 6000 "$out/compile20.log"; exit 1; }
fi
g++ -o "$build/nccl_test" "$build"/*.o -L"$torch/lib" -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 ${TORCH_EXTRA_LIBS:-} -Wl,--as-needed \
  "$nccl_lib/libnccl.so.2" "$cudart" "$crypto" -lpthread -Wl,-rpath,"$torch/lib:$nccl_lib:$cudart_lib:$(dirname "$crypto")" \
  > "$out/link.log" 2>&1 || { echo "link failed:"; head -c 6000 "$out/link.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

status=0
export TESSERA_TEST_TIMEOUT_MS=60000 OMP_NUM_THREADS=1
echo "== 1 rank, every case"
timeout 200 $py tools/tessera-launch --nproc-per-node 1 --master-port 29631 --job nccl_np1 --grace-period 2 -- \
  "$build/nccl_test" --durations yes 2>&1 | tee "$out/np1.log" || status=1
echo "== 2 ranks, rank 1 never joins: rank 0 times out"
timeout 60 $py tools/tessera-launch --nproc-per-node 2 --master-port 29632 --job nccl_lonely --grace-period 2 -- \
  "$build/nccl_test" "[.init_timeout]" 2>&1 | tee "$out/init_timeout.log" || status=1
echo "== 2 ranks on GPU 0: the shared-GPU case"
CUDA_VISIBLE_DEVICES=0 timeout 90 $py tools/tessera-launch --nproc-per-node 2 --master-port 29633 --job nccl_np2 \
  --grace-period 2 -- "$build/nccl_test" "[.shared_gpu]" 2>&1 | tee "$out/np2_shared.log" || status=1
exit $status
