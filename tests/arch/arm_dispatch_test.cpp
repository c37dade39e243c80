// tests/arch/arm_dispatch_test.cpp: run-time dispatch on AArch64 (arch/isa.hpp, arch/native.hpp):
// the HWCAP reading against the instructions themselves (each set's probe instruction run
// under a SIGILL handler), TILEATTN_ISA's cap, select_isa, and the name active_isa() gives.
// Run under qemu-aarch64 with several CPUs (scripts/arm_tests.sh), so each answer is checked
// on a CPU with and without SVE and BF16.
#include <gtest/gtest.h>

#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <string>

#include "tileattn/active_isa.hpp"
#include "tileattn/arch/native.hpp"

#if !TILEATTN_ARCH_ARM_DISPATCH
#error "arm_dispatch_test is for AArch64 builds with GCC"
#endif

namespace tileattn {
namespace {

sigjmp_buf probe_jump;
void on_sigill(int) { siglongjmp(probe_jump, 1); }

/// True when calling `probe` raises no SIGILL.
bool runs(void (*probe)()) {
  struct sigaction action = {}, previous = {};
  action.sa_handler = on_sigill;
  sigemptyset(&action.sa_mask);
  sigaction(SIGILL, &action, &previous);
  volatile bool ok = false;  // volatile: set between sigsetjmp and a siglongjmp
  if (sigsetjmp(probe_jump, 1) == 0) {
    probe();
    ok = true;
  }
  sigaction(SIGILL, &previous, nullptr);
  return ok;
}

volatile int sink = 0;
[[gnu::noinline, gnu::target("arch=armv8.2-a+sve")]] void sve_probe() {
  int vl = 0;
  asm volatile("cntw %x0" : "=r"(vl));  // an SVE instruction
  sink = vl;
}
[[gnu::noinline, gnu::target("arch=armv8.2-a+bf16")]] void bf16_probe() {
  asm volatile("bfdot v0.4s, v1.8h, v2.8h" ::: "v0");  // FEAT_BF16's NEON dot product
}
[[gnu::noinline, gnu::target("arch=armv8.2-a+sve+bf16")]] void sve_bf16_probe() {
  asm volatile("bfdot z0.s, z1.h, z2.h" ::: "z0");  // SVE's, which HWCAP2_SVEBF16 announces
}

/// The best set by the instructions that run.
arch::Isa isa_by_probing() {
  const bool sve = runs(sve_probe), bf16 = runs(bf16_probe);
  if (sve) return bf16 && runs(sve_bf16_probe) ? arch::Isa::sve_bf16 : arch::Isa::sve;
  return bf16 ? arch::Isa::neon_bf16 : arch::Isa::neon;
}

TEST(ArmDispatch, HwcapAgreesWithTheInstructions) {
  std::printf("[ dispatch ] CPU set %s, running %s\n", arch::isa_name(arch::cpu_isa()), active_isa());
  EXPECT_EQ(arch::cpu_isa(), isa_by_probing());
  EXPECT_TRUE(isa_dispatched_at_run_time);
}

TEST(ArmDispatch, RunsTheCpuSetUnlessCapped) {
  const char* cap = std::getenv("TILEATTN_ISA");
  if (cap != nullptr && *cap != '\0') {
    std::string want = cap;
    bool known = false;
    for (arch::Isa isa : arch::all_isas) {
      if (want == arch::isa_name(isa)) {
        EXPECT_EQ(arch::dispatched_isa(), arch::best_within(isa, arch::cpu_isa())) << cap;
        known = true;
      }
    }
    if (!known) {
      EXPECT_EQ(arch::dispatched_isa(), arch::cpu_isa()) << cap;  // an unknown name caps nothing
    }
  } else {
    EXPECT_EQ(arch::dispatched_isa(), arch::cpu_isa());
  }
  EXPECT_STREQ(active_isa(), arch::isa_name(arch::dispatched_isa()));
}

TEST(ArmDispatch, SelectIsaTakesOnlyWhatTheCpuRuns) {
  const arch::Isa before = arch::dispatched_isa();
  for (arch::Isa isa : arch::all_isas) {
    const bool runs_here = arch::within(isa, arch::cpu_isa());
    EXPECT_EQ(arch::select_isa(isa), runs_here) << arch::isa_name(isa);
    if (runs_here) {
      EXPECT_STREQ(active_isa(), arch::isa_name(isa));
      EXPECT_EQ(arch::native::bf16_dot_product(), isa == arch::Isa::neon_bf16 || isa == arch::Isa::sve_bf16);
    }
  }
  // No x86 set runs here; generic and neon always do.
  EXPECT_FALSE(arch::within(arch::Isa::avx2, arch::cpu_isa()));
  EXPECT_TRUE(arch::within(arch::Isa::neon, arch::cpu_isa()));
  ASSERT_TRUE(arch::select_isa(before));
}

TEST(ArmDispatch, CapsTakeTheBestSetWithinBoth) {
  using arch::Isa;
  using arch::best_within;
  EXPECT_EQ(best_within(Isa::sve_bf16, Isa::sve), Isa::sve);
  EXPECT_EQ(best_within(Isa::neon_bf16, Isa::sve), Isa::neon);
  EXPECT_EQ(best_within(Isa::sve, Isa::neon_bf16), Isa::neon);
  EXPECT_EQ(best_within(Isa::sve_bf16, Isa::neon_bf16), Isa::neon_bf16);
  EXPECT_EQ(best_within(Isa::neon, Isa::sve_bf16), Isa::neon);
  EXPECT_EQ(best_within(Isa::generic, Isa::sve_bf16), Isa::generic);
  EXPECT_EQ(best_within(Isa::avx512_bf16, Isa::sve_bf16), Isa::generic);  // another architecture's
  EXPECT_EQ(best_within(Isa::avx512_bf16, Isa::avx2), Isa::avx2);
}

}  // namespace
}  // namespace tileattn
