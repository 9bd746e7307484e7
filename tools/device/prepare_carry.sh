#!/usr/bin/env bash
# Fills .device/ (ignored through .git/info/exclude) with what nccl_check.sh needs on the GPU
# machine and that machine lacks: Catch2's header, OpenSSL's headers and libcrypto, all from this
# machine's Debian packages. Run here, then name .device in the device tool's carry.
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/include/catch2 .device/include/openssl .device/lib
cp /usr/include/catch2/catch.hpp .device/include/catch2/
cp /usr/include/openssl/*.h .device/include/openssl/
cp /usr/include/x86_64-linux-gnu/openssl/*.h .device/include/openssl/
cp -L /usr/lib/x86_64-linux-gnu/libcrypto.so.3 .device/lib/
du -sh .device
