#!/usr/bin/env bash
# scripts/sanitize.sh: the reliability checks of .ci/run (docs/reliability.md):
#   1. the whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++, -O1,
#      -fno-sanitize-recover=all, leaks checked), every backend, every test of the Release
#      run but those that run no tileattn code in this build (the exclusions below, each with
#      its reason); determinism checks repeat 3 times (races are TSan's, which repeats them
#      as often as the Release run); with MPI, ring attention's suite on 1 to 4 ranks and on
#      2 and 3 with its progress thread (leak checks off there: Open MPI's own allocations);
#   2. every suite that runs the kernels on several threads under ThreadSanitizer (clang with
#      LLVM's libomp and its Archer tool, so OpenMP's synchronisation is visible): the
#      backend, the forward and its variants, the backward, the paged kernels (split-KV,
#      prefix-once, top-k, MLA, 8- and 4-bit caches, rotary), the cache manager, merges, flex
#      and ring attention; determinism repeats at the Release count (50). Built without
#      oneTBB: Debian's libtbb is not instrumented and its task hand-offs, inlined from its
#      headers into our binaries, are reported by the dozen (docs/reliability.md);
#   3. each libFuzzer harness under ASan + UBSan for its share of TILEATTN_FUZZ_RUNS inputs
#      (8000 by default: 40,000 inputs in all, tests/fuzz/CMakeLists.txt) from its seed corpus.
# Every build takes -g1 (line tables: reports still give file:line; a third less compile
# time than -g), and the ASan and TSan builds compile the forward and backward once into
# tileattn::instantiations for every test to link (tests/CMakeLists.txt).
# Builds in build-asan/, build-tsan/ and build-fuzz/; exits non-zero on any report. Works
# from any directory. Run one part with: scripts/sanitize.sh asan|tsan|fuzz
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/install_deps.sh

jobs="$(nproc)"
parts=("${@:-asan tsan fuzz}")
read -r -a parts <<< "${parts[*]}"
llvm_lib=/usr/lib/llvm-14/lib
common=(-DTILEATTN_BUILD_BENCHMARKS=OFF -DTILEATTN_INSTALL=OFF --log-level=NOTICE)
linked=(-DTILEATTN_BUILD_INSTANTIATIONS=ON)  # kernels compiled once for every test (tests/CMakeLists.txt)
# Ninja for a new build directory (scripts/test.sh says why); an existing one keeps its generator.
generator() { [[ -f "$1/CMakeCache.txt" ]] || echo "-G Ninja"; }

run_asan() {
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer (g++)"
  # With MPI: ring attention's suite on 1 to 4 ranks, and on 2 and 3 with its progress
  # thread (tests/distributed/CMakeLists.txt).
  cmake -S . -B build-asan $(generator build-asan) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=g++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_WITH_MPI=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
  cmake --build build-asan -j"$jobs"
  # Not run here, because no tileattn code runs under the sanitizer in them: the packaging
  # tests (-L package: they configure and build separate consumer projects, with their own
  # flags), the compile_fail cases (the compiler's -fsyntax-only on a file: nothing runs) and
  # the layer check (a Python script reading #include lines).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  TILEATTN_DETERMINISM_REPEATS=3 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE package -E "compile_fail|^layers\."
}

run_tsan() {
  echo "== ThreadSanitizer (clang, libomp + Archer; serial and OpenMP backends)"
  cmake -S . -B build-tsan $(generator build-tsan) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_WITH_TBB=OFF -DTILEATTN_WITH_MPI=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread"
  # Every suite whose kernels run on several threads (parallel_for over work items, split-KV's
  # and prefix-once's merge passes, the backward's dQ hand-offs, ring's progress thread).
  local targets=(backend_parallel_for_test backend_tsan_canary backend_execution_test
                 kernels_forward_test kernels_forward_precision_test kernels_backward_test
                 kernels_backward_determinism_test variants_combinations_test variants_nonfinite_test
                 variants_nonfinite_storage_test variants_gqa_test variants_varlen_test
                 variants_batch_invariance_test paged_forward_test paged_merge_states_test
                 paged_split_kv_test paged_kv_cache_test paged_quantized_kv_test paged_quantized_4bit_test
                 paged_rotary_test flex_forward_test flex_backward_test flex_paged_test flex_block_mask_test)
  local ring=()
  # grep reads the whole list (no -q): with -q it stops at the match, cmake dies of SIGPIPE
  # writing the rest, and pipefail made the test false, so the ring suite went unbuilt.
  if cmake --build build-tsan --target help | grep "^distributed_ring_test" > /dev/null; then ring=(distributed_ring_test); fi
  cmake --build build-tsan -j"$jobs" --target "${targets[@]}" "${ring[@]}"
  local names
  names="$(IFS='|'; echo "${targets[*]}")"
  # Open MPI is not instrumented: ignore_noninstrumented_modules keeps its internals out of
  # the reports; the ring suite's own threads (the progress thread) are checked.
  OMP_TOOL_LIBRARIES="$llvm_lib/libarcher.so" \
  TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$repo_root/tests/tsan.supp" \
  TILEATTN_DETERMINISM_REPEATS=50 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "^(($names):|distributed\.ring)"
}

run_fuzz() {
  echo "== libFuzzer harnesses (clang, ASan + UBSan)"
  # The harnesses link the kernels compiled once (tileattn::instantiations) with the same
  # sanitizers and libFuzzer's coverage instrumentation (fuzzer-no-link), so the fuzzer sees
  # and checks the kernels as it did when each harness compiled its own copy.
  cmake -S . -B build-fuzz $(generator build-fuzz) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_BUILD_FUZZERS=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fsanitize=fuzzer-no-link" \
    -DTILEATTN_FUZZ_RUNS="${TILEATTN_FUZZ_RUNS:-8000}" -DTILEATTN_WITH_MPI=ON
  cmake --build build-fuzz -j"$jobs" --target fuzzers
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-fuzz --output-on-failure -L fuzz -j"$jobs"
}

for part in "${parts[@]}"; do
  case "$part" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    fuzz) run_fuzz ;;
    *) echo "sanitize.sh: unknown part '$part' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done
