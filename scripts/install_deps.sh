#!/usr/bin/env bash
# scripts/install_deps.sh: installs the Debian packages tileattn's build, tests and benchmarks need.
# Quiet and does nothing when they are all present. When some are missing: installs them as
# root, otherwise prints the command to run and exits 1.
set -euo pipefail

packages=(build-essential cmake ninja-build libeigen3-dev libtbb-dev libgtest-dev libgmock-dev
          libbenchmark-dev libopenblas-dev python3 python3-venv python3-dev  # python3-*: python/
          clang libclang-rt-14-dev libomp-14-dev  # the sanitizer and fuzzer builds (scripts/sanitize.sh)
          libopenmpi-dev openmpi-bin)            # ring attention over MPI (tileattn/distributed/)

# Installed for this machine's architecture (or for all): with Debian's multiarch, the arm64
# copy scripts/arm_tests.sh installs (libtbb-dev:arm64, ...) must not count.
native_arch=$(dpkg --print-architecture)
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Architecture} ${Status}\n' "$package" 2>/dev/null |
       grep -Eq "^($native_arch|all) install ok installed$"; then
    missing+=("$package")
  fi
done

if (( ${#missing[@]} == 0 )); then
  exit 0
fi

command="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if (( EUID == 0 )); then
  echo "install_deps: installing ${missing[*]}" >&2
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "install_deps: missing Debian packages: ${missing[*]}" >&2
  echo "install_deps: run this as root, then try again:" >&2
  echo "  $command" >&2
  exit 1
fi
