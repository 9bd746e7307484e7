#!/usr/bin/env bash
# Installs this build into a scratch prefix, configures and builds tests/install/consumer against
# it with find_package(tessera), and runs the consumer; the installed tessera-launch starts two ranks.
set -euo pipefail
build_dir=$1 source_dir=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log"
# The installed launcher finds its package (share/tessera/launch) and starts a rank.
out=$(python3 "$work/prefix/bin/tessera-launch" --nproc-per-node 2 --no-prefix -- sh -c 'echo "rank $RANK"' | sort | tr '\n' ' ')
[ "$out" = "rank 0 rank 1 " ] || { echo "installed tessera-launch: got '$out'"; exit 1; }
cmake -S "$source_dir/tests/install/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
