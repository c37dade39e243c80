// tests/memory/scratch_arena_test.cpp: a worker's SRAM (memory/scratch_arena.hpp): 64-byte
// aligned carves rounded to whole lines, the byte budget enforced with budget_error, reset,
// the high-water mark, and the per-thread worker_scratch.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "tileattn/memory/scratch_arena.hpp"

namespace tileattn {
namespace {

bool line_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

TEST(ScratchArena, RoundUpToLine) {
  EXPECT_EQ(round_up_to_line(0), 0u);
  EXPECT_EQ(round_up_to_line(1), 64u);
  EXPECT_EQ(round_up_to_line(64), 64u);
  EXPECT_EQ(round_up_to_line(65), 128u);
  EXPECT_EQ(cache_line_bytes, 64u);
}

TEST(ScratchArena, CarvesAreAlignedAndRoundedToLines) {
  ScratchArena arena(4096);
  EXPECT_EQ(arena.budget(), 4096u);
  EXPECT_EQ(arena.used(), 0u);
  float* a = arena.carve<float>(3);    // 12 bytes -> one line
  EXPECT_EQ(arena.used(), 64u);
  double* b = arena.carve<double>(9);  // 72 bytes -> two lines
  EXPECT_EQ(arena.used(), 192u);
  char* c = arena.carve<char>(64);
  EXPECT_EQ(arena.used(), 256u);
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(c)})
    EXPECT_TRUE(line_aligned(p));
  EXPECT_EQ(reinterpret_cast<std::byte*>(b) - reinterpret_cast<std::byte*>(a), 64);
  EXPECT_EQ(reinterpret_cast<std::byte*>(c) - reinterpret_cast<std::byte*>(b), 128);
  // The pieces are usable memory.
  for (int i = 0; i < 3; ++i) a[i] = 1.0f;
  for (int i = 0; i < 9; ++i) b[i] = 2.0;
}

TEST(ScratchArena, BudgetIsRoundedUpAndEnforced) {
  ScratchArena arena(100);  // rounds up to 128
  EXPECT_EQ(arena.budget(), 128u);
  arena.carve<float>(16);  // 64
  arena.carve<float>(16);  // 128: exactly full
  EXPECT_EQ(arena.used(), 128u);
  try {
    arena.carve<float>(1);
    ADD_FAILURE() << "carving past the budget did not throw";
  } catch (const budget_error& e) {
    EXPECT_EQ(e.parameter(), "sram_budget_bytes");
  }
  EXPECT_EQ(arena.used(), 128u) << "a failed carve must not take bytes";
  EXPECT_EQ(arena.high_water(), 128u);

  ScratchArena small(256);
  EXPECT_THROW(small.carve<float>(65), budget_error);  // 260 bytes -> 320 > 256
  EXPECT_EQ(small.used(), 0u);
  EXPECT_NO_THROW(small.carve<float>(64));
}

TEST(ScratchArena, ResetFreesEverythingHighWaterStays) {
  ScratchArena arena(1024);
  float* first = arena.carve<float>(40);  // 160 -> 192
  arena.carve<float>(100);                // 400 -> 448
  EXPECT_EQ(arena.used(), 640u);
  EXPECT_EQ(arena.high_water(), 640u);
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.high_water(), 640u);
  EXPECT_EQ(arena.carve<float>(1), first) << "reset starts carving from the beginning again";
  EXPECT_EQ(arena.high_water(), 640u);
  arena.carve<float>(200);  // 64 + 832 = 896
  EXPECT_EQ(arena.high_water(), 896u);
}

TEST(ScratchArena, ZeroBudget) {
  ScratchArena arena(0);
  EXPECT_EQ(arena.budget(), 0u);
  EXPECT_THROW(arena.carve<float>(1), budget_error);
}

TEST(WorkerScratch, OnePerThreadKeptAndReset) {
  ScratchArena& a = worker_scratch(4096);
  a.carve<float>(10);
  ScratchArena& b = worker_scratch(4096);
  EXPECT_EQ(&a, &b) << "the same thread gets the same arena back";
  EXPECT_EQ(b.used(), 0u) << "worker_scratch resets the arena";
  ScratchArena& c = worker_scratch(8192);
  EXPECT_EQ(c.budget(), 8192u) << "a different budget regrows it";
  ScratchArena* other = nullptr;
  std::thread t([&] { other = &worker_scratch(8192); });
  t.join();
  EXPECT_NE(other, &worker_scratch(8192)) << "another thread has its own arena";
}

}  // namespace
}  // namespace tileattn

namespace tileattn {
namespace {

// worker_scratch keeps the largest capacity asked for and sets the budget of each call.
TEST(WorkerScratch, GrowsOnlyAndTakesEachCallsBudget) {
  std::thread t([] {
    ScratchArena& a = worker_scratch(8192);
    EXPECT_EQ(a.capacity(), 8192u);
    ScratchArena& b = worker_scratch(1024);
    EXPECT_EQ(&a, &b);
    EXPECT_EQ(b.capacity(), 8192u) << "a smaller call keeps the memory";
    EXPECT_EQ(b.budget(), 1024u) << "but carves within its own budget";
    EXPECT_THROW(b.carve<float>(1024 / sizeof(float) + 1), budget_error);
    EXPECT_EQ(worker_scratch(20000).capacity(), round_up_to_line(20000));
  });
  t.join();
}

}  // namespace
}  // namespace tileattn
