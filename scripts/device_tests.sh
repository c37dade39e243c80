#!/usr/bin/env bash
# scripts/device_tests.sh: the whole ctest suite on the lent 16-core Xeon (AMX), a machine with
# CMake, ninja, g++ and PyTorch but without Debian's -dev packages or a package registry.
#
#   bash scripts/device_tests.sh --prepare   # here: copies GoogleTest's sources and Eigen into .gtest/
#   bash scripts/device_tests.sh             # there (run with carry [".gtest"]): everything
#   bash scripts/device_tests.sh -R paged    # there: arguments after the first go to ctest
#
# On the device it builds GoogleTest from .gtest/googletest (a copy of Debian's
# /usr/src/googletest) into a prefix, configures the project as scripts/test.sh does (Release,
# tests, examples, the instantiations library, -march=native, so arch::native selects the real
# AMX tiles) with what the machine has: no Google Benchmark (benchmarks off), no oneTBB, MPI and
# the Python package where they are found (python3 with torch and nanobind), builds with every
# core and runs all of ctest. Prints the CPU's matrix-unit flags, the ISA tileattn selects, and
# ctest's summary; the whole log goes to $OUT/device_tests.log when OUT is set. Exits non-zero
# on any failure. BUILD_DIR (default /tmp/device-build) and JOBS (default nproc) may be set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
deps="$root/.gtest"

if [[ "${1:-}" == "--prepare" ]]; then  # on the dev machine: the sources the device lacks
  mkdir -p "$deps/eigen/include" "$deps/eigen/share"
  rm -rf "$deps/googletest" && cp -r /usr/src/googletest "$deps/googletest"
  rm -rf "$deps/eigen/include/eigen3" && cp -r /usr/include/eigen3 "$deps/eigen/include/eigen3"
  rm -rf "$deps/eigen/share/eigen3" && cp -r /usr/share/eigen3 "$deps/eigen/share/eigen3"
  du -sh "$deps"
  exit 0
fi

build="${BUILD_DIR:-/tmp/device-build}"
prefix="$build/deps"
jobs="${JOBS:-$(nproc)}"
log="${OUT:-$build}/device_tests.log"
mkdir -p "$build" "$(dirname "$log")"
exec > >(tee "$log") 2>&1

echo "== device_tests: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "== matrix-unit flags: $(grep -m1 -o -w -E 'amx_tile|amx_bf16|amx_int8|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
[[ -d "$deps/googletest" ]] || { echo "device_tests: no $deps/googletest (run --prepare here, carry .gtest)"; exit 2; }

if [[ ! -f "$prefix/lib/cmake/GTest/GTestConfig.cmake" && ! -f "$prefix/lib64/cmake/GTest/GTestConfig.cmake" ]]; then
  cmake -S "$deps/googletest" -B "$build/gtest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_GMOCK=ON >/dev/null &&
    cmake --build "$build/gtest" -j"$jobs" >/dev/null && cmake --install "$build/gtest" >/dev/null ||
    { echo "device_tests: GoogleTest did not build"; exit 1; }
fi

options=(-DCMAKE_BUILD_TYPE=Release -DTILEATTN_BUILD_TESTS=ON -DTILEATTN_BUILD_EXAMPLES=ON
         -DTILEATTN_BUILD_BENCHMARKS=OFF -DTILEATTN_BUILD_INSTANTIATIONS=ON -DTILEATTN_WITH_TBB=OFF
         "-DCMAKE_PREFIX_PATH=$prefix;$deps/eigen")
if command -v mpicxx >/dev/null && command -v mpiexec >/dev/null; then
  options+=(-DTILEATTN_WITH_MPI=ON); echo "== MPI: $(command -v mpiexec)"
else
  echo "== MPI: none on this machine (ring attention's suite not built)"
fi
if python3 -c "import torch, nanobind, pytest" 2>/dev/null; then
  options+=(-DTILEATTN_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)")
  echo "== Python: $(python3 -c 'import torch; print("torch", torch.__version__)')"
else
  echo "== Python: no torch/nanobind/pytest (the Python package's tests not built)"
fi

start=$(date +%s)
cmake -S . -B "$build/tileattn" -G Ninja --log-level=NOTICE "${options[@]}" || exit 1
cmake --build "$build/tileattn" -j"$jobs" > "$build/build.log" 2>&1 ||
  { grep -E "error|Error" "$build/build.log" | head -40; echo "device_tests: the build failed"; exit 1; }
echo "== built in $(( $(date +%s) - start )) s"
printf '#include <cstdio>\n#include <tileattn/active_isa.hpp>\nint main() { std::puts(tileattn::active_isa()); }\n' |
  g++ -std=c++20 -O1 -march=native -Iinclude -x c++ - -o "$build/isa" && echo "== tileattn runs: $("$build/isa")"
start=$(date +%s)
ctest --test-dir "$build/tileattn" -j"$jobs" --output-on-failure "${@}" > "$build/ctest.log" 2>&1
status=$?
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess aborted\)|Exception|Not Run" "$build/ctest.log" | head -80
echo "== ctest in $(( $(date +%s) - start )) s, exit $status"
[[ -n "${OUT:-}" ]] && cp "$build/ctest.log" "$OUT/ctest.log"
exit $status
