#!/usr/bin/env bash
# scripts/test.sh: builds everything (Release: tests, examples and benchmarks) in build-tests/
# and runs the whole ctest suite; exits non-zero on any failure. Works from any directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bash scripts/install_deps.sh

jobs="$(nproc)"
# Ninja for a new build directory: it starts a test's compilation while the libraries it
# links still build (make waits for them), which keeps both cores busy; an existing
# directory keeps the generator it was made with.
generator=()
[[ -f build-tests/CMakeCache.txt ]] || generator=(-G Ninja)
cmake -S . -B build-tests "${generator[@]}" --log-level=NOTICE \
  -DCMAKE_BUILD_TYPE=Release \
  -DTILEATTN_BUILD_TESTS=ON \
  -DTILEATTN_BUILD_EXAMPLES=ON \
  -DTILEATTN_BUILD_BENCHMARKS=ON \
  -DTILEATTN_BUILD_INSTANTIATIONS=ON \
  -DTILEATTN_WITH_MPI=ON
cmake --build build-tests -j"$jobs"
ctest --test-dir build-tests --output-on-failure -j"$jobs"
