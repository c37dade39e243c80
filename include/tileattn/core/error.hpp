// tileattn/core/error.hpp: the exceptions tileattn throws: invalid arguments, each naming the bad
// parameter, and a KV cache pool with too few free pages.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace tileattn {

/// Thrown for every invalid argument. `parameter()` names the offending argument
/// (for example "q", "k.shape[1]", "softmax_scale"); what() reads
/// "tileattn: <parameter>: <reason>". Nothing has been written when it is thrown.
class invalid_argument : public std::invalid_argument {
 public:
  invalid_argument(std::string parameter, const std::string& reason)
      : std::invalid_argument("tileattn: " + parameter + ": " + reason),
        parameter_(std::move(parameter)) {}

  const std::string& parameter() const noexcept { return parameter_; }

 private:
  std::string parameter_;
};

/// Thrown when a tile plan does not fit the SRAM byte budget ("sram_budget_bytes"), or a
/// scratch arena is asked for more than its budget.
class budget_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// Thrown by KvCache (kv_cache.hpp) when extend, append or a copy-on-write needs more free
/// pages than the pool has: `needed()` pages, `available()` free. Nothing has changed.
class out_of_pages : public std::runtime_error {
 public:
  out_of_pages(std::int64_t needed, std::int64_t available)
      : std::runtime_error("tileattn: out of pages: need " + std::to_string(needed) + ", " +
                           std::to_string(available) + " free"),
        needed_(needed),
        available_(available) {}

  std::int64_t needed() const noexcept { return needed_; }
  std::int64_t available() const noexcept { return available_; }

 private:
  std::int64_t needed_, available_;
};

namespace detail {

inline void require(bool condition, const std::string& parameter, const std::string& reason) {
  if (!condition) throw invalid_argument(parameter, reason);
}

/// The parts one after another, appended into one string: for messages that start with a
/// literal and a name (`std::string("x '") + name + "'"` makes GCC 12 report a false
/// -Warray-bounds inside basic_string's move at -O2, GCC bug 105651).
inline std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) out.append(part);
  return out;
}

[[noreturn]] inline void fail(const std::string& parameter, const std::string& reason) {
  throw invalid_argument(parameter, reason);
}

}  // namespace detail
}  // namespace tileattn

/// Throws tileattn::invalid_argument(parameter, reason) unless `condition` holds; the
/// parameter name and the reason are only evaluated on failure, so a check costs one
/// branch (argument checks run on every call, a decode step's included).
#define TILEATTN_REQUIRE(condition, ...)                              \
  do {                                                                \
    if (!(condition)) ::tileattn::detail::fail(__VA_ARGS__);          \
  } while (false)

namespace tileattn {
namespace detail {

}  // namespace detail
}  // namespace tileattn
