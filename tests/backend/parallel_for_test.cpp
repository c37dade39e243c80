// tests/backend/parallel_for_test.cpp: the one parallel_for contract (backend/parallel_for.hpp),
// checked on every compiled-in backend (serial.hpp, openmp.hpp, tbb.hpp) and thread count:
// every item runs exactly once, worker ids are in [0, worker_count) and never shared by two
// bodies running at once, and an exception thrown by a body reaches the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"

namespace tileattn {
namespace {

std::vector<Backend> backends_under_test() {
  std::vector<Backend> out{Backend::automatic};
  for (Backend b : {Backend::serial, Backend::openmp, Backend::tbb})
    if (backend_available(b)) out.push_back(b);
  return out;
}

using Param = std::tuple<Backend, int>;  // backend, num_threads

class ParallelFor : public ::testing::TestWithParam<Param> {};

TEST_P(ParallelFor, EveryItemOnceWorkersInRangeAndExclusive) {
  const auto [backend, threads] = GetParam();
  const Execution exec{backend, threads};
  const int workers = worker_count(exec);
  ASSERT_GE(workers, 1);
  for (index_t count : {0, 1, 5, 97, 2000}) {
    std::vector<std::atomic<int>> runs(static_cast<std::size_t>(count));
    auto busy = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(workers));
    std::atomic<int> bad_worker{0}, shared_worker{0};
    parallel_for(exec, count, [&](index_t item, int worker) {
      if (worker < 0 || worker >= workers) {
        ++bad_worker;
      } else if (busy[static_cast<std::size_t>(worker)].exchange(true)) {
        ++shared_worker;  // another body is running under the same worker id
      }
      runs[static_cast<std::size_t>(item)].fetch_add(1);
      volatile double sink = 0;  // a little work, so bodies overlap
      for (int i = 0; i < 200; ++i) sink = sink + i;
      if (worker >= 0 && worker < workers) busy[static_cast<std::size_t>(worker)].store(false);
    });
    EXPECT_EQ(bad_worker.load(), 0) << "worker id outside [0, " << workers << ")";
    EXPECT_EQ(shared_worker.load(), 0) << "two concurrent bodies shared a worker id";
    for (index_t item = 0; item < count; ++item)
      ASSERT_EQ(runs[static_cast<std::size_t>(item)].load(), 1) << "item " << item << " of " << count;
  }
}

TEST_P(ParallelFor, ExceptionsReachTheCaller) {
  const auto [backend, threads] = GetParam();
  const Execution exec{backend, threads};
  std::atomic<int> ran{0};
  try {
    parallel_for(exec, 64, [&](index_t item, int) {
      ++ran;
      if (item == 17) throw std::runtime_error("item 17 failed");
    });
    ADD_FAILURE() << "the exception was swallowed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 17 failed");
  }
  EXPECT_GE(ran.load(), 1);
  // The backend still works afterwards.
  std::atomic<int> after{0};
  parallel_for(exec, 10, [&](index_t, int) { ++after; });
  EXPECT_EQ(after.load(), 10);
}

TEST_P(ParallelFor, WorkerCount) {
  const auto [backend, threads] = GetParam();
  const int workers = worker_count({backend, threads});
  if (resolve_backend(backend) == Backend::serial) {
    EXPECT_EQ(workers, 1);
  } else if (threads > 0) {
    EXPECT_EQ(workers, threads);
  } else {
    EXPECT_GE(workers, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ParallelFor,
                         ::testing::Combine(::testing::ValuesIn(backends_under_test()),
                                            ::testing::Values(0, 1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "threads";
                         });

TEST(Backends, AvailabilityAndResolution) {
  EXPECT_TRUE(backend_available(Backend::serial));
  EXPECT_TRUE(backend_available(Backend::automatic));
#if defined(TILEATTN_HAS_OPENMP)
  EXPECT_TRUE(backend_available(Backend::openmp));
#else
  EXPECT_FALSE(backend_available(Backend::openmp));
#endif
#if defined(TILEATTN_HAS_TBB)
  EXPECT_TRUE(backend_available(Backend::tbb));
#else
  EXPECT_FALSE(backend_available(Backend::tbb));
#endif
  const Backend automatic = resolve_backend(Backend::automatic);
  if (backend_available(Backend::openmp)) {
    EXPECT_EQ(automatic, Backend::openmp);
  } else if (backend_available(Backend::tbb)) {
    EXPECT_EQ(automatic, Backend::tbb);
  } else {
    EXPECT_EQ(automatic, Backend::serial);
  }
  for (Backend b : {Backend::serial, Backend::openmp, Backend::tbb}) EXPECT_EQ(resolve_backend(b), b);
}

TEST(Backends, ValidateExecution) {
  EXPECT_NO_THROW(detail::validate_execution({Backend::serial, 0}));
  EXPECT_NO_THROW(detail::validate_execution({Backend::automatic, 7}));
  try {
    detail::validate_execution({Backend::serial, -2});
    ADD_FAILURE() << "negative num_threads accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "num_threads");
  }
  for (Backend b : {Backend::openmp, Backend::tbb}) {
    if (backend_available(b)) continue;
    try {
      detail::validate_execution({b, 1});
      ADD_FAILURE() << to_string(b) << " is not compiled in but was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), "backend");
    }
  }
}

// A call never starts more threads than it has items: worker ids stay below the item
// count even when far more threads are asked for (before: 30000 threads for a 16 x 16
// problem, a stack overflow in GOMP_parallel at 100000).
TEST(Backends, NeverMoreWorkersThanItems) {
  for (Backend b : backends_under_test())
    for (index_t count : {1, 2, 5}) {
      const Execution exec{b, max_threads};
      EXPECT_EQ(worker_count(exec, count), resolve_backend(b) == Backend::serial ? 1 : count);
      std::atomic<int> max_worker{-1}, ran{0};
      parallel_for(exec, count, [&](index_t, int worker) {
        ++ran;
        int seen = max_worker.load();
        while (worker > seen && !max_worker.compare_exchange_weak(seen, worker)) {}
      });
      EXPECT_EQ(ran.load(), count);
      EXPECT_LT(max_worker.load(), count) << to_string(b);
    }
}

TEST(Backends, ThreadCountLimit) {
  EXPECT_NO_THROW(detail::validate_execution({Backend::automatic, max_threads}));
  for (int threads : {max_threads + 1, 30000, 100000}) {
    try {
      detail::validate_execution({Backend::automatic, threads});
      ADD_FAILURE() << threads << " threads accepted";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), "num_threads");
    }
  }
}

TEST(Backends, SerialRunsInOrderOnTheCallingThread) {
  std::vector<index_t> order;
  backend::Serial::parallel_for(6, 4, [&](index_t item, int worker) {
    EXPECT_EQ(worker, 0);
    order.push_back(item);
  });
  EXPECT_EQ(order, (std::vector<index_t>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace tileattn
