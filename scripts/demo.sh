#!/usr/bin/env bash
# scripts/demo.sh: builds the tileattn demo (Release, benchmarks only) in build/ and runs it;
# arguments are passed to the demo. Works from any directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bash scripts/install_deps.sh

cmake -S . -B build --log-level=NOTICE \
  -DCMAKE_BUILD_TYPE=Release \
  -DTILEATTN_BUILD_TESTS=OFF \
  -DTILEATTN_BUILD_BENCHMARKS=ON \
  -DTILEATTN_BUILD_EXAMPLES=OFF
cmake --build build --target tileattn_demo -j"$(nproc)"

exec build/benchmarks/tileattn_demo "$@"
