#!/usr/bin/env bash
# benchmarks/compile_time.sh: what a translation unit that calls tileattn::forward once costs
# to compile (-O2 -march=native, g++), per storage type, header-only and through the extern
# templates of tileattn::instantiations (TILEATTN_EXTERN_TEMPLATES); and, for comparison, the
# same fp32 TU against the headers of an older commit (default: cd1a2b5, before bf16/fp16).
# Prints the median of 3 compiles (seconds) and the largest peak RSS (MB). A benchmark, not a
# test: it times the machine's compiler, which shared machines slow down.
#
#   bash benchmarks/compile_time.sh [base-commit]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${1:-cd1a2b5}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cxx="${CXX:-g++}"
flags=(-std=gnu++20 -O2 -march=native -fopenmp)

tu() {  # $1: element type
  cat <<EOT
#include "tileattn/tileattn.hpp"
void call($1* q, $1* k, $1* v, $1* o, int n) {
  using namespace tileattn;
  forward(make_bshd(q, 1, n, 8, 128), make_bshd(k, 1, n, 8, 128), make_bshd(v, 1, n, 8, 128),
          make_bshd(o, 1, n, 8, 128));
}
EOT
}

measure() {  # $1: label, $2: include dir, $3: source, rest: extra flags
  local label="$1" inc="$2" src="$3"; shift 3
  local times=() rss=0
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$work/time" "$cxx" "${flags[@]}" "$@" -I"$inc" -c "$src" -o "$work/out.o"
    read -r t m < "$work/time"
    times+=("$t")
    (( m > rss )) && rss=$m
  done
  local median
  median="$(printf '%s\n' "${times[@]}" | sort -g | sed -n 2p)"
  printf '%-52s %6.2f s  %5d MB   (runs: %s)\n' "$label" "$median" $((rss / 1024)) "${times[*]}"
}

for t in float bf16 fp16; do
  type="$t"; [[ $t != float ]] && type="tileattn::$t"
  tu "$type" > "$work/$t.cpp"
done

if git -C "$repo" cat-file -e "$base^{commit}" 2>/dev/null; then
  mkdir -p "$work/base"
  git -C "$repo" archive "$base" include | tar -x -C "$work/base"
  measure "fp32, headers of $base" "$work/base/include" "$work/float.cpp"
fi
for t in float bf16 fp16; do
  measure "$t, header-only" "$repo/include" "$work/$t.cpp"
done
for t in float bf16 fp16; do
  measure "$t, extern templates (tileattn::instantiations)" "$repo/include" "$work/$t.cpp" -DTILEATTN_EXTERN_TEMPLATES
done
measure "src/instantiations_forward.cpp (all three, once)" "$repo/include" "$repo/src/instantiations_forward.cpp"
measure "src/instantiations_backward.cpp (all three, once)" "$repo/include" "$repo/src/instantiations_backward.cpp"
