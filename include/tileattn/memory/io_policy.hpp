// tileattn/memory/io_policy.hpp: the contract of an IO policy (memory/io_counter.hpp), as a
// concept: what the tile loads and stores (memory/tile_io.hpp), the score modifiers and the
// kernels' run_forward / run_backward ask of the `Io` they are templated on.
//
// A kernel keeps one policy per worker (a std::vector<Io> of default-constructed ones),
// reports every byte it moves through read() and written(), and, when Io::enabled (a
// constant), sums the workers' `counts` into the IoCounts it returns. A policy that lacks one
// of these fails at the kernel's template head with the name io_policy, not deep inside a
// load.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "tileattn/memory/io_counter.hpp"

namespace tileattn {

/// An HBM traffic policy: read(bytes) and written(bytes) on a mutable policy, a constant
/// `enabled`, and, when enabled, the IoCounts `counts` the kernel sums.
template <class Io>
concept io_policy =
    std::default_initializable<Io> && std::move_constructible<Io> &&
    requires(Io& io, std::uint64_t bytes) {
      typename std::bool_constant<Io::enabled>;  // a constant: `if constexpr (Io::enabled)`
      io.read(bytes);
      io.written(bytes);
    } &&
    (!Io::enabled || requires(IoCounts& total, const Io& io) { total += io.counts; });

static_assert(io_policy<NoIoCounting>);
static_assert(io_policy<CountingIo>);

}  // namespace tileattn
