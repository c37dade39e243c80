#!/usr/bin/env bash
# scripts/sanitize.sh: the reliability checks of .ci/run (docs/reliability.md):
#   1. the whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++,
#      -fno-sanitize-recover=all, leaks checked), every backend; not the examples (they call
#      the kernels the suites test, and building them again under ASan took minutes of CI)
#      nor six numerical sweeps (the docs' error-figure printers, the accuracy-ratio sweep,
#      the every-feature combination, the 1023 x 1024 backward, the 1000 x 1000 forwards of
#      LongShapes, the emulated AMX's bitwise sweep over threads and backends and its two
#      error-rule sweeps (47 s under ASan): 3.3 of ASan's 6.2 minutes of tests, and more),
#      which the Release run keeps; the flex and 8-bit cache suites compile at -O0 there
#      (tests/CMakeLists.txt: 2 minutes less build, their tests 3x slower), so their
#      bit-equality and IO-count checks (flex's every-backend and every-budget bits, its
#      equality with the built-in options, its hidden-tile IO) and the forward's exact IO
#      counts over 40 shapes (44 s) are left to Release too: they compare numbers, and run
#      the same kernels as the suites' accuracy tests, which ASan keeps; so are the
#      slowest accuracy sweeps of those -O0 suites (the 8-bit caches' bf16-query sweeps, five
#      of flex's backward cases, its bf16/fp16 precision sweeps) and the half kernels'
#      bitwise sweep on awkward shapes (123 s of test time under ASan), whose code the
#      smaller cases beside them run too, and three more (31 s): the non-finite sweep and the
#      GQA determinism check (TSan runs both), the draft-tree verify sweep; nor the
#      compile-time checks (the
#      compile_fail cases and the layer check run no tileattn code); determinism checks
#      repeat 3 times (races are TSan's: 20 there); with MPI, ring attention's suite on 2 ranks and
#      on 3 with its progress thread (leak checks off there: Open MPI's own allocations);
#   2. the suites that run the kernels on several threads under ThreadSanitizer, without the
#      numerical sweeps (the error-figure printers, the every-feature combination) (clang with
#      LLVM's libomp and its Archer tool, so OpenMP's synchronisation is visible). Built
#      without oneTBB: Debian's libtbb is not instrumented and its task hand-offs, inlined
#      from its headers into our binaries, are reported by the dozen (docs/reliability.md);
#   3. each libFuzzer harness under ASan + UBSan for its share of TILEATTN_FUZZ_RUNS inputs
#      from its seed corpus (tests/fuzz/CMakeLists.txt).
# Every build takes -g1 (line tables: reports still give file:line; a third less compile
# time than -g, which CI's 30 minutes need), and the ASan and TSan builds compile the
# forward and backward once into tileattn::instantiations for every test to link
# (tests/CMakeLists.txt): a test under ASan compiled 3x faster.
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
  # With MPI: ring attention's suite on 2 ranks and on 3 with its progress thread, without
  # its *Large* cases (tests/distributed/CMakeLists.txt).
  cmake -S . -B build-asan $(generator build-asan) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=g++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_WITH_MPI=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  TILEATTN_DETERMINISM_REPEATS=3 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE package \
      -E "PrintsErrorFiguresForDocs|FlashAttentionRuleAndErrorRatios|LargeCombinations|BackwardLarge|LongShapes|Bf16BitwiseIdenticalAcrossThreadCountsAndBackends|Bf16ForwardWithinTwiceNaiveBf16|Bf16BackwardWithinThriceNaiveBf16|ForwardIoExact|SameBitsForEveryBackend|BlockMaskAddsNoPlanDependence|HiddenQueryTilesLoadNothing|FlexForwardEqualsBuiltin|Bf16QueriesE4m3|Bf16QueriesInt8|FlexBackwardAccuracy\.(RelativeBiasPrefixLm|CustomWithGradBlockSparse|Bf16UnderTheRule|AlibiCausal|SoftcapDocument)|FlexForwardPrecision|PairGemmMatchesGenericBitwiseOnAwkwardShapes|NonFiniteValuesReachOnlyRowsThatSeeTheirKey|BackwardDeterminism\.FloatCausalGqa|TreeVerify\.MatchesTheReferenceWithTheTreeAsADenseMask|compile_fail|^layers\."
}

run_tsan() {
  echo "== ThreadSanitizer (clang, libomp + Archer; serial and OpenMP backends)"
  cmake -S . -B build-tsan $(generator build-tsan) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_WITH_TBB=OFF \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread"
  local targets=(backend_parallel_for_test backend_tsan_canary variants_combinations_test
                 variants_nonfinite_test kernels_forward_test variants_gqa_test variants_varlen_test
                 kernels_forward_precision_test variants_nonfinite_storage_test
                 kernels_backward_determinism_test kernels_backward_test paged_forward_test
                 paged_merge_states_test)
  cmake --build build-tsan -j"$jobs" --target "${targets[@]}"
  OMP_TOOL_LIBRARIES="$llvm_lib/libarcher.so" \
  TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$repo_root/tests/tsan.supp" \
  TILEATTN_DETERMINISM_REPEATS=20 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" \
      -R "^(backend_parallel_for_test|backend_tsan_canary|variants_combinations_test|variants_nonfinite_test|kernels_forward_test|variants_gqa_test|variants_varlen_test|kernels_forward_precision_test|variants_nonfinite_storage_test|kernels_backward_determinism_test|kernels_backward_test|paged_forward_test|paged_merge_states_test):" \
      -E "SmallShapes|LongShapes|EveryCombination|BackwardLarge|PrintsErrorFiguresForDocs|LargeCombinations"
}

run_fuzz() {
  echo "== libFuzzer harnesses (clang, ASan + UBSan)"
  # The harnesses link the kernels compiled once (tileattn::instantiations) with the same
  # sanitizers and libFuzzer's coverage instrumentation (fuzzer-no-link), so the fuzzer sees
  # and checks the kernels as it did when each harness compiled its own copy.
  cmake -S . -B build-fuzz $(generator build-fuzz) "${common[@]}" "${linked[@]}" -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_EXAMPLES=OFF -DTILEATTN_BUILD_FUZZERS=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fsanitize=fuzzer-no-link" \
    -DTILEATTN_FUZZ_RUNS="${TILEATTN_FUZZ_RUNS:-6000}"
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
