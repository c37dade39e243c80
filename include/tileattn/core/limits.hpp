// tileattn/core/limits.hpp: every bound tileattn puts on an argument, in one place; a value
// outside one is an invalid_argument naming the argument (docs/options.md, "Errors").
#pragma once

#include <cstddef>
#include <limits>
#include <numbers>

#include "tileattn/core/types.hpp"

namespace tileattn {

/// head_dim (Q and K) and head_dim_v (V and O) are any value in [1, max_head_dim].
inline constexpr index_t max_head_dim = 1024;

/// The most threads a call may ask for (Execution::num_threads).
inline constexpr int max_threads = 1024;

/// The largest SRAM budget a call may ask for (ForwardOptions::sram_budget_bytes): 1 GiB,
/// far above any cache; each worker allocates only its plan's working set.
inline constexpr std::size_t max_sram_budget_bytes = std::size_t{1} << 30;

/// The most bytes tileattn allocates for one object whose size the arguments choose (a
/// KvCache's pools, scales and page state; a BlockMask's block kinds): 2^47 = 128 TiB, the
/// user address space of a process on x86-64 and AArch64 Linux with 48-bit virtual
/// addresses (5-level page tables map higher addresses only for mmap calls that ask).
/// Larger sizes cannot be mapped: they are invalid arguments, not a std::bad_alloc after
/// some of the allocations were made.
inline constexpr index_t max_allocation_bytes = index_t{1} << 47;

/// The largest |ScoreOptions::diagonal_offset|: 2^48 positions, so that no position plus
/// an offset and a window side overflows index_t.
inline constexpr index_t max_diagonal_offset = index_t{1} << 48;

/// The kernels compute softmax exponents in log2 units, so a value x in natural-log units
/// (softmax_scale, sinks, ALiBi slopes times a distance, bias entries) becomes
/// x * log2(e): |x| must stay below this for that to be a finite float (about 2.36e38).
inline constexpr float max_natural_log_magnitude =
    std::numeric_limits<float>::max() / std::numbers::log2e_v<float>;

}  // namespace tileattn
