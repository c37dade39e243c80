// tileattn/distributed/ring_comm.hpp: the MPI pieces ring attention needs: a rank's
// neighbours, non-blocking block exchanges with them (MPI_Isend / MPI_Irecv, split below
// 2^31 bytes), a collective check that every rank's arguments are valid and agree before
// any transfer, a sum over ranks in rank order (the same bits on every run), and a thread
// that progresses transfers during compute. The MPI C API only. MPI_THREAD_FUNNELED is
// enough: MPI calls are made from the calling thread, or, under MPI_THREAD_SERIALIZED or
// above, from the progress thread while the calling thread makes none.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tileattn/core/error.hpp"
#include "tileattn/core/types.hpp"

namespace tileattn::ring::detail {

inline void mpi_check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string("tileattn: ") + call + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

/// A rank's place in the ring: it sends to next() and receives from prev(). The ring talks
/// on its own duplicate of the caller's communicator (collective, freed at the end), so
/// its messages never match the application's, whatever their tags.
struct RingComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;

  explicit RingComm(MPI_Comm c) {
    TILEATTN_REQUIRE(c != MPI_COMM_NULL, "comm", "is MPI_COMM_NULL");
    mpi_check(MPI_Comm_dup(c, &comm), "MPI_Comm_dup");
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  ~RingComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  RingComm(const RingComm&) = delete;
  RingComm& operator=(const RingComm&) = delete;
  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  /// Whose block this rank holds at ring step `step`: blocks move to next() each step.
  int source(int step) const { return (rank - step % size + size) % size; }
};

/// One exchange in flight: a buffer to next(), another from prev(), in parts of at most
/// 1 GiB (an MPI count is an int).
class Exchange {
 public:
  static constexpr std::size_t part_bytes = std::size_t{1} << 30;

  void post(const RingComm& ring, const void* send, void* recv, std::size_t bytes, int tag) {
    const auto* out = static_cast<const unsigned char*>(send);
    auto* in = static_cast<unsigned char*>(recv);
    for (std::size_t at = 0, part = 0; at < bytes || (bytes == 0 && part == 0); at += part_bytes, ++part) {
      const int n = static_cast<int>(std::min(part_bytes, bytes - at));
      requests_.emplace_back();
      mpi_check(MPI_Irecv(in + at, n, MPI_BYTE, ring.prev(), tag, ring.comm, &requests_.back()), "MPI_Irecv");
      requests_.emplace_back();
      mpi_check(MPI_Isend(out + at, n, MPI_BYTE, ring.next(), tag, ring.comm, &requests_.back()), "MPI_Isend");
      if (bytes == 0) break;
    }
    sent_ += bytes;
  }
  /// Lets MPI progress the transfers (over shared memory and TCP, Open MPI moves data only
  /// inside MPI calls); returns at once.
  void progress() {
    if (requests_.empty()) return;
    int done = 0;
    mpi_check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) requests_.clear();
  }
  void wait() {
    if (requests_.empty()) return;
    mpi_check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    requests_.clear();
  }
  std::uint64_t bytes_sent() const { return sent_; }

 private:
  std::vector<MPI_Request> requests_;
  std::uint64_t sent_ = 0;
};

/// Keeps MPI moving the exchanges in flight while the calling thread computes: a thread that
/// tests them every millisecond, from construction to destruction (every 20 or 250 us cost
/// 10-38% of the compute of 2 ranks on 2 busy cores, every 1 ms was within the noise;
/// a K/V block takes milliseconds to move). Over shared memory
/// and TCP, Open MPI moves a large message only inside MPI calls, so without it a transfer
/// waits for the next MPI call. MPI allows the thread only when it was initialised with
/// MPI_THREAD_SERIALIZED or above (and the calling thread makes no MPI call meanwhile);
/// below that, active() is false and the caller calls progress() between its kernels.
class BackgroundProgress {
 public:
  explicit BackgroundProgress(std::initializer_list<Exchange*> exchanges)
      : exchanges_(exchanges), active_(allowed()) {
    if (!active_) return;
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_acquire)) {
        for (Exchange* e : exchanges_) e->progress();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~BackgroundProgress() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }
  BackgroundProgress(const BackgroundProgress&) = delete;
  BackgroundProgress& operator=(const BackgroundProgress&) = delete;

  bool active() const { return active_; }
  /// True when this process's MPI allows a second thread to call it (SERIALIZED or MULTIPLE).
  static bool allowed() {
    int level = MPI_THREAD_SINGLE;
    mpi_check(MPI_Query_thread(&level), "MPI_Query_thread");
    return level >= MPI_THREAD_SERIALIZED;
  }

 private:
  std::vector<Exchange*> exchanges_;
  bool active_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// A value every rank must agree on, named as the argument it comes from: an integer, a
/// float (its bits: float_field) or a hash of an array (hash_field), compared as int64.
struct Field {
  enum class Kind { integer, real, hash };
  const char* name;
  std::int64_t value;
  Kind kind = Kind::integer;
};

/// The bits of a float, as a Field compares them.
inline std::int64_t float_bits(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

/// A stable 64-bit hash of some floats' bits (FNV-1a), to compare option arrays across ranks.
inline std::int64_t hash_bits(std::span<const float> values) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    for (int byte = 0; byte < 4; ++byte) h = (h ^ ((bits >> (8 * byte)) & 0xffu)) * 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

inline Field float_field(const char* name, float x) { return {name, float_bits(x), Field::Kind::real}; }
inline Field hash_field(const char* name, std::span<const float> values) {
  return {name, hash_bits(values), Field::Kind::hash};
}

/// What the error says when rank r's value of a field differs from rank 0's: the two
/// values (floats as floats, to 9 significant digits: every float is told apart), or, for
/// an array's hash, only that the arrays differ.
inline std::string disagreement(const Field& f, std::int64_t first, int r, std::int64_t other) {
  const auto show = [&](std::int64_t value) {
    if (f.kind != Field::Kind::real) return std::to_string(value);
    float x;
    const auto bits = static_cast<std::uint32_t>(value);
    std::memcpy(&x, &bits, sizeof x);
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(x));
    return std::string(text);
  };
  if (f.kind == Field::Kind::hash)
    return "differs across ranks: rank 0's and rank " + std::to_string(r) + "'s values are not the same";
  return "differs across ranks: rank 0 has " + show(first) + ", rank " + std::to_string(r) + " has " + show(other);
}

/// Runs `local_checks` (which throw tileattn::invalid_argument), then compares `fields`
/// across the ranks of `ring`. Collective: every rank throws, or none does. A rank whose
/// own check failed rethrows its error; the others throw one naming the same parameter
/// and the failing rank. A field that differs is an error naming it on every rank.
inline void agree(const RingComm& ring, const std::function<void()>& local_checks, std::span<const Field> fields) {
  constexpr std::size_t name_size = 64, reason_size = 320;
  struct Verdict {
    char parameter[name_size] = {};
    char reason[reason_size] = {};
  } mine;
  std::exception_ptr own;  // this rank's error, rethrown after every rank has reported
  try {
    local_checks();
  } catch (const invalid_argument& e) {
    own = std::current_exception();
    std::strncpy(mine.parameter, e.parameter().c_str(), name_size - 1);
    std::strncpy(mine.reason, e.what(), reason_size - 1);
  } catch (const std::exception& e) {  // still report, or the other ranks would wait forever
    own = std::current_exception();
    std::strncpy(mine.parameter, "arguments", name_size - 1);
    std::strncpy(mine.reason, e.what(), reason_size - 1);
  }
  std::vector<Verdict> all(static_cast<std::size_t>(ring.size));
  mpi_check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, ring.comm), "MPI_Allgather");
  if (own) std::rethrow_exception(own);
  for (int r = 0; r < ring.size; ++r) {
    const Verdict& v = all[static_cast<std::size_t>(r)];
    if (v.parameter[0] != '\0')
      throw invalid_argument(v.parameter, "rejected on rank " + std::to_string(r) + " (" + v.reason + ")");
  }

  std::vector<std::int64_t> values;
  for (const Field& f : fields) values.push_back(f.value);
  std::vector<std::int64_t> table(values.size() * static_cast<std::size_t>(ring.size));
  mpi_check(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_INT64_T, table.data(),
                          static_cast<int>(values.size()), MPI_INT64_T, ring.comm),
            "MPI_Allgather");
  for (int r = 1; r < ring.size; ++r)
    for (std::size_t f = 0; f < values.size(); ++f) {
      const std::int64_t first = table[f], other = table[static_cast<std::size_t>(r) * values.size() + f];
      TILEATTN_REQUIRE(first == other, fields[f].name, disagreement(fields[f], first, r, other));
    }
}

/// values = the sum over ranks of every rank's values, added in rank order (MPI_Allreduce
/// may add in any order; this gives the same bits on every run and every rank).
inline void sum_in_rank_order(const RingComm& ring, std::span<float> values) {
  std::vector<float> all(values.size() * static_cast<std::size_t>(ring.size));
  mpi_check(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_FLOAT, all.data(),
                          static_cast<int>(values.size()), MPI_FLOAT, ring.comm),
            "MPI_Allgather");
  for (std::size_t i = 0; i < values.size(); ++i) {
    float sum = 0.0f;
    for (int r = 0; r < ring.size; ++r) sum += all[static_cast<std::size_t>(r) * values.size() + i];
    values[i] = sum;
  }
}

}  // namespace tileattn::ring::detail
