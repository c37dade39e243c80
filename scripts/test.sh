#!/usr/bin/env bash
# scripts/test.sh: builds everything (Release: tests, examples and benchmarks, warnings as
# errors: the build is warning-free on g++ 12 and a warning there is a defect) in build-tests/
# and the Python package (python/, in a virtual environment build-tests/python-venv), and runs
# the whole ctest suite, the Python tests included; exits non-zero on any failure. Works from
# any directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bash scripts/install_deps.sh

# The Python package (python/): its build tools now, PyTorch and transformers for its tests in
# the background while the C++ builds (a minute of download and unpacking).
venv=build-tests/python-venv
bash scripts/python_env.sh "$venv" build
bash scripts/python_env.sh "$venv" test > build-tests/python-env.log 2>&1 &
python_env=$!

jobs="$(nproc)"
# Ninja for a new build directory: it starts a test's compilation while the libraries it
# links still build (make waits for them), which keeps both cores busy; an existing
# directory keeps the generator it was made with.
generator=()
[[ -f build-tests/CMakeCache.txt ]] || generator=(-G Ninja)
cmake -S . -B build-tests "${generator[@]}" --log-level=NOTICE \
  -DCMAKE_BUILD_TYPE=Release -DTILEATTN_WERROR=ON \
  -DTILEATTN_BUILD_TESTS=ON \
  -DTILEATTN_BUILD_EXAMPLES=ON \
  -DTILEATTN_BUILD_BENCHMARKS=ON \
  -DTILEATTN_BUILD_INSTANTIATIONS=ON \
  -DTILEATTN_WITH_MPI=ON \
  -DTILEATTN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$repo_root/$venv/bin/python"
cmake --build build-tests -j"$jobs"
wait "$python_env" || { cat build-tests/python-env.log; exit 1; }
ctest --test-dir build-tests --output-on-failure -j"$jobs"
