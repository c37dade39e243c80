#!/usr/bin/env bash
# scripts/bits_probe.sh: checks that the working tree computes the same bits as another
# revision (a refactoring's "no behaviour change"): builds tests/bits_probe/bits_probe.cpp (this
# tree's probe) against BASE's headers and against this tree's, runs both under every
# micro-kernel set this CPU has (TILEATTN_ISA generic, avx2, avx512, avx512-bf16, and on a CPU
# with AMX also with TILEATTN_NO_AMX=1), each call at 1 and 2 threads, and compares every
# output file with cmp. Exits non-zero on any difference. Run-time dispatch (no -march), -O2,
# OpenMP; about 3 minutes of compilation on 2 cores.
#
#   scripts/bits_probe.sh BASE        BASE: a revision (e.g. main~3), or the include/ directory
#                                     of another copy of the headers (where there is no git)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${1:?usage: scripts/bits_probe.sh BASE_REV|BASE_INCLUDE_DIR}"
work="$(mktemp -d /tmp/bits_probe.XXXXXX)"
trap 'git -C "$repo_root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

if [[ -d "$base" ]]; then
  base_include="$(cd "$base" && pwd)"
else
  git -C "$repo_root" worktree add --detach "$work/base" "$base" >/dev/null
  base_include="$work/base/include"
fi
probe="$repo_root/tests/bits_probe/bits_probe.cpp"
build() {  # build <include dir> <binary>
  ${CXX:-g++} -std=c++20 -O2 -fopenmp -I"$1" "$probe" -o "$2"
}
build "$base_include" "$work/probe_base" &
base_build=$!
build "$repo_root/include" "$work/probe_head"
wait "$base_build"

sets=(generic avx2 avx512 avx512-bf16)
grep -q avx2 /proc/cpuinfo || sets=(generic)
grep -q avx512f /proc/cpuinfo || sets=(generic avx2)
grep -q avx512_bf16 /proc/cpuinfo || sets=("${sets[@]/avx512-bf16}")
runs=()
for s in "${sets[@]}"; do [[ -n "$s" ]] && runs+=("TILEATTN_ISA=$s"); done
grep -q amx_tile /proc/cpuinfo && runs+=("TILEATTN_NO_AMX=1")

differ=0 files=0
for run in "${runs[@]}"; do
  for side in base head; do
    mkdir -p "$work/$run/$side"
    env "$run" "$work/probe_$side" "$work/$run/$side" > "$work/$run/$side.log"
  done
  for f in "$work/$run/base"/*.bin; do
    name="$(basename "$f")"
    files=$((files + 1))
    if ! cmp -s "$f" "$work/$run/head/$name"; then
      echo "differs: $run $name"
      differ=$((differ + 1))
    fi
  done
  echo "$run: $(cat "$work/$run/head.log")"
done
echo "bits_probe: $files files compared against $base, $differ differ"
[[ $differ -eq 0 ]]
