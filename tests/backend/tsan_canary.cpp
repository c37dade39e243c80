// tests/backend/tsan_canary.cpp: a deliberate data race inside a parallel_for body, built
// only for the ThreadSanitizer run of scripts/sanitize.sh, where it must FAIL: proof that
// TSan, LLVM's libomp and Archer see races between work items (a clean TSan run means
// something only if this one is caught). Every item sleeps a little so that both threads
// take items.
#include <chrono>
#include <cstdio>
#include <thread>

#include "tileattn/backend/parallel_for.hpp"

int main() {
  int shared = 0;  // written by every item without synchronisation: the race
  tileattn::parallel_for({tileattn::Backend::openmp, 2}, 8, [&](tileattn::index_t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ++shared;
  });
  std::printf("%d\n", shared);
}
