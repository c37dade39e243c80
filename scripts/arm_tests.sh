#!/usr/bin/env bash
# scripts/arm_tests.sh: the AArch64 job. Cross-compiles the test suite with Debian's
# g++-aarch64-linux-gnu (cmake/toolchains/aarch64-linux-gnu.cmake; Release, warnings as errors,
# no -march, so the micro-kernel sets are chosen at run time) in build-arm/, and runs the whole
# ctest suite under qemu-aarch64 (user mode) on four emulated CPUs:
#   neon     cortex-a72: NEON only (no SVE, no BF16)
#   sve128   max, 128-bit SVE vectors   (SVE, SVE2, BF16: arch::sve_bf16)
#   sve256   max, 256-bit
#   sve512   max, 512-bit
# On each, the arch suites also run every set below the best (TILEATTN_ISA: generic, neon,
# neon-bf16, sve). Installs what it needs (arm64 packages through Debian's multiarch).
# Usage: scripts/arm_tests.sh [cpu...]   (default: all four; e.g. "sve256" for one)
# ARM_CTEST_ARGS adds to ctest's arguments (e.g. "-L core" while working on one suite; CI
# passes none: the whole suite).
# Not part of the ring-attention suite: MPI is left out of the Arm build (TILEATTN_WITH_MPI off).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# The cross compiler, qemu, and the arm64 libraries the tests link and load.
need=()
for package in g++-aarch64-linux-gnu qemu-user ninja-build cmake libeigen3-dev; do
  [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)" == "install ok installed" ]] || need+=("$package")
done
for package in libgtest-dev:arm64 libtbb-dev:arm64 libgomp1:arm64 libstdc++6:arm64; do
  [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)" == "install ok installed" ]] || need+=("$package")
done
if (( ${#need[@]} > 0 )); then
  if (( EUID != 0 )); then
    echo "arm_tests: missing ${need[*]}; run as root (dpkg --add-architecture arm64 first)" >&2
    exit 1
  fi
  echo "arm_tests: installing ${need[*]}" >&2
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi

generator=()
[[ -f build-arm/CMakeCache.txt ]] || generator=(-G Ninja)
cmake -S . -B build-arm "${generator[@]}" --log-level=NOTICE \
  -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=Release -DTILEATTN_WERROR=ON -DTILEATTN_NATIVE_ARCH=OFF \
  -DTILEATTN_BUILD_TESTS=ON -DTILEATTN_BUILD_INSTANTIATIONS=ON -DTILEATTN_TEST_TIMEOUT=7200 \
  -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_BUILD_BENCHMARKS=OFF -DTILEATTN_WITH_MPI=OFF
cmake --build build-arm -j"$(nproc)"

cpus=("$@")
(( ${#cpus[@]} > 0 )) || cpus=(neon sve128 sve256 sve512)
for cpu in "${cpus[@]}"; do
  case "$cpu" in
    neon) qemu_cpu=cortex-a72 ;;
    sve128) qemu_cpu=max,sve-default-vector-length=16 ;;
    sve256) qemu_cpu=max,sve-default-vector-length=32 ;;
    sve512) qemu_cpu=max,sve-default-vector-length=64 ;;
    *) echo "arm_tests: unknown cpu $cpu (neon, sve128, sve256, sve512)" >&2; exit 2 ;;
  esac
  echo "arm_tests: $cpu (QEMU_CPU=$qemu_cpu)"
  start=$SECONDS
  # shellcheck disable=SC2086  # ARM_CTEST_ARGS is a list of words
  QEMU_CPU="$qemu_cpu" ctest --test-dir build-arm --output-on-failure -j"$(nproc)" ${ARM_CTEST_ARGS:-}
  echo "arm_tests: $cpu passed in $((SECONDS - start)) s"
done
