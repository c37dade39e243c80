// tests/arch/dispatch_test.cpp: a build without -march (arch/isa.hpp's dispatched build)
// picks the set this CPU has, computes the bits a -march=native build computes here, and
// runs in the speed class of the SIMD sets, not the scalar one.
//
// Built WITHOUT tileattn_project_flags' -march=native (tests/arch/CMakeLists.txt); the
// -march=native forward it compares against lives in a shared library of its own
// (dispatch_reference.cpp) whose inline code cannot mix with this TU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "dispatch_reference.hpp"
#include "reference/naive_attention.hpp"
#include "tileattn/tileattn.hpp"

namespace {
using namespace tileattn;

static_assert(TILEATTN_ARCH_DISPATCH == 1, "dispatch_test must be built without AVX2 / AVX-512 flags");

/// What the CPU offers, by GCC's and Clang's own reading of CPUID (not arch/isa.hpp's).
arch::Isa isa_from_builtins() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx512) return __builtin_cpu_supports("avx512bf16") ? arch::Isa::avx512_bf16 : arch::Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return arch::Isa::avx2;
  return arch::Isa::generic;
}

/// Restores the process's set when a test that changes it ends.
struct IsaGuard {
  arch::Isa saved = arch::dispatched_isa();
  ~IsaGuard() { arch::select_isa(saved); }
};

/// Exact inputs in [-2, 2) with 10 fraction bits: made with integer arithmetic only, so both
/// builds get the same values (the standard distributions compute in float, and a
/// -march=native build may fuse their multiply-adds).
template <class T>
std::vector<T> inputs(std::size_t n, std::uint32_t seed) {
  std::vector<T> x(n);
  for (T& e : x) {
    seed = seed * 1664525u + 1013904223u;
    e = T(static_cast<float>(static_cast<int>(seed >> 20) - 2048) / 1024.0f);
  }
  return x;
}

template <class T>
struct Outputs {
  std::vector<T> o;
  std::vector<float> lse;
};

template <class T>
Outputs<T> run_here(const DispatchCase& c, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                int threads = 1) {
  Outputs<T> r{std::vector<T>(q.size()), std::vector<float>(static_cast<std::size_t>(c.batch * c.heads_q * c.seqlen_q))};
  std::vector<float> storage;
  ForwardOptions opts = dispatch_options(c, storage);
  opts.execution = {Backend::serial, threads};
  forward(make_bshd<const T>(q.data(), c.batch, c.seqlen_q, c.heads_q, c.head_dim),
          make_bshd<const T>(k.data(), c.batch, c.seqlen_k, c.heads_kv, c.head_dim),
          make_bshd<const T>(v.data(), c.batch, c.seqlen_k, c.heads_kv, c.head_dim),
          make_bshd(r.o.data(), c.batch, c.seqlen_q, c.heads_q, c.head_dim),
          make_lse(r.lse.data(), c.batch, c.heads_q, c.seqlen_q), opts);
  return r;
}

template <class T>
constexpr int type_code() {
  return std::is_same_v<T, float> ? dispatch_fp32 : std::is_same_v<T, bf16> ? dispatch_bf16 : dispatch_fp16;
}

const DispatchCase cases[] = {
    {1, 200, 200, 4, 2, 64, 0, 0},  // GQA, edges in every tile dimension
    {2, 97, 130, 2, 2, 128, 1, 0},  // causal, seqlen_q != seqlen_k
    {1, 33, 300, 3, 1, 80, 0, 0},   // MQA, head_dim not a multiple of 16
};

/// Soft-capping, ALiBi and sinks: score code outside arch/ with multiply-adds a -march=native
/// GCC build fuses (docs/design.md, "Choosing the micro-kernels").
const DispatchCase options_case{1, 150, 150, 4, 2, 64, 1, 1};

/// Runs case c in this build and in the -march=native one.
template <class T>
std::pair<Outputs<T>, Outputs<T>> run_both(const DispatchCase& c) {
  const auto q = inputs<T>(static_cast<std::size_t>(c.batch * c.seqlen_q * c.heads_q * c.head_dim), 1);
  const auto k = inputs<T>(static_cast<std::size_t>(c.batch * c.seqlen_k * c.heads_kv * c.head_dim), 2);
  const auto v = inputs<T>(k.size(), 3);
  Outputs<T> here = run_here(c, q, k, v);
  Outputs<T> native{std::vector<T>(q.size()), std::vector<float>(here.lse.size())};
  dispatch_reference_forward(type_code<T>(), q.data(), k.data(), v.data(), native.o.data(), native.lse.data(), &c);
  return {std::move(here), std::move(native)};
}

template <class T>
void expect_same_bits_as_native_build() {
  for (const DispatchCase& c : cases) {
    SCOPED_TRACE("case B " + std::to_string(c.batch) + " Nq " + std::to_string(c.seqlen_q) + " d " +
                 std::to_string(c.head_dim) + (c.score_options ? " softcap+alibi+sinks" : ""));
    const auto [here, native] = run_both<T>(c);
    EXPECT_EQ(std::memcmp(here.o.data(), native.o.data(), here.o.size() * sizeof(T)), 0) << "O differs";
    EXPECT_EQ(std::memcmp(here.lse.data(), native.lse.data(), here.lse.size() * sizeof(float)), 0) << "LSE differs";
  }
}

TEST(Dispatch, ChoosesTheBestSetTheCpuHas) {
  EXPECT_EQ(arch::cpu_isa(), isa_from_builtins());
  EXPECT_TRUE(isa_dispatched_at_run_time);
  const std::string name = active_isa();
  std::printf("[ dispatch ] CPU set %s; running %s; -march=native build runs %s\n", arch::isa_name(arch::cpu_isa()),
              name.c_str(), dispatch_reference_isa());
  if (std::getenv("TILEATTN_ISA") == nullptr) {
    EXPECT_EQ(arch::dispatched_isa(), arch::cpu_isa());
    EXPECT_EQ(name.rfind(arch::isa_name(arch::cpu_isa()), 0), 0u) << name;  // "+amx" may follow
    EXPECT_EQ(name, std::string(dispatch_reference_isa())) << "the -march=native build runs another set";
  }
}

TEST(Dispatch, SelectIsaRefusesWhatTheCpuLacks) {
  IsaGuard guard;
  for (arch::Isa isa : {arch::Isa::generic, arch::Isa::avx2, arch::Isa::avx512, arch::Isa::avx512_bf16}) {
    EXPECT_EQ(arch::select_isa(isa), isa <= arch::cpu_isa()) << arch::isa_name(isa);
    if (isa <= arch::cpu_isa()) {
      EXPECT_EQ(arch::dispatched_isa(), isa);
      EXPECT_EQ(std::string(active_isa()).rfind(arch::isa_name(isa), 0), 0u);
    }
  }
}

TEST(Dispatch, SameBitsAsNativeBuildFp32) {
  if (std::getenv("TILEATTN_ISA")) GTEST_SKIP() << "TILEATTN_ISA set: this build runs another set than -march=native";
  expect_same_bits_as_native_build<float>();
}
TEST(Dispatch, SameBitsAsNativeBuildBf16) {
  if (std::getenv("TILEATTN_ISA")) GTEST_SKIP() << "TILEATTN_ISA set: this build runs another set than -march=native";
  expect_same_bits_as_native_build<bf16>();
}
TEST(Dispatch, SameBitsAsNativeBuildFp16) {
  if (std::getenv("TILEATTN_ISA")) GTEST_SKIP() << "TILEATTN_ISA set: this build runs another set than -march=native";
  expect_same_bits_as_native_build<fp16>();
}

// Score options, whose scalar updates go through the micro-kernels (add_alibi_bias, mul_add)
// so that they are fused as a -march=native build fuses them.
TEST(Dispatch, SameBitsAsNativeBuildWithScoreOptions) {
  if (std::getenv("TILEATTN_ISA")) GTEST_SKIP() << "TILEATTN_ISA set: this build runs another set than -march=native";
  const auto [here, native] = run_both<float>(options_case);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < here.o.size(); ++i) differ += std::memcmp(&here.o[i], &native.o[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "O values that differ from the -march=native build's, of " << here.o.size();
  EXPECT_EQ(std::memcmp(here.lse.data(), native.lse.data(), here.lse.size() * sizeof(float)), 0) << "LSE differs";
}

// Every set the CPU has, against the double-precision reference (fp32 inputs: the usual
// tolerance of the forward tests; bf16 pair products round P to bf16 as well).
TEST(Dispatch, EverySetMatchesTheReference) {
  IsaGuard guard;
  const DispatchCase c = cases[1];
  const auto q = inputs<float>(static_cast<std::size_t>(c.batch * c.seqlen_q * c.heads_q * c.head_dim), 4);
  const auto k = inputs<float>(static_cast<std::size_t>(c.batch * c.seqlen_k * c.heads_kv * c.head_dim), 5);
  const auto v = inputs<float>(k.size(), 6);
  const auto view = [](const std::vector<float>& x, const DispatchCase& cc, index_t n, index_t h) {
    return make_bshd<const float>(x.data(), cc.batch, n, h, cc.head_dim);
  };
  const auto ref = reference::attention<float>(view(q, c, c.seqlen_q, c.heads_q), view(k, c, c.seqlen_k, c.heads_kv),
                                               view(v, c, c.seqlen_k, c.heads_kv),
                                               1.0 / std::sqrt(static_cast<double>(c.head_dim)), c.causal != 0);
  for (arch::Isa isa : {arch::Isa::generic, arch::Isa::avx2, arch::Isa::avx512, arch::Isa::avx512_bf16}) {
    if (!arch::select_isa(isa)) continue;
    SCOPED_TRACE(active_isa());
    const Outputs<float> r = run_here(c, q, k, v);
    double worst = 0.0;
    for (std::size_t i = 0; i < r.o.size(); ++i) worst = std::max(worst, std::abs(r.o[i] - ref.o[i]));
    EXPECT_LT(worst, 1e-5);
  }
}

// The point of dispatching: the speed class of -march=native, not the scalar set's (17x at
// -O2 in issue 28; 6.5-18x here at -O3, where GCC vectorizes the scalar set with SSE2, the
// lower end on an idle machine). 4x leaves room for noise.
TEST(Dispatch, FasterThanTheGenericSet) {
  if (arch::cpu_isa() == arch::Isa::generic) GTEST_SKIP() << "no SIMD set on this CPU";
  IsaGuard guard;
  const DispatchCase c{1, 512, 512, 2, 2, 64, 0, 0};
  const auto q = inputs<float>(static_cast<std::size_t>(c.seqlen_q * c.heads_q * c.head_dim), 7);
  const auto k = inputs<float>(q.size(), 8), v = inputs<float>(q.size(), 9);
  const auto best_of_3 = [&] {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run_here(c, q, k, v);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double simd = best_of_3();
  const std::string simd_name = active_isa();
  ASSERT_TRUE(arch::select_isa(arch::Isa::generic));
  const double scalar = best_of_3();
  std::printf("[ dispatch ] fp32 forward N 512 d 64 H 2: %s %.2f ms, generic %.2f ms (%.1fx)\n", simd_name.c_str(),
              simd * 1e3, scalar * 1e3, scalar / simd);
  EXPECT_GT(scalar / simd, 4.0);
}

}  // namespace
