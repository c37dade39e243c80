// tests/arch/dispatch_reference.hpp: the C interface of dispatch_reference.cpp, the forward
// built with -march=native into its own shared library, which dispatch_test.cpp (built
// without -march) compares its bits against.
#pragma once

#include <cmath>
#include <vector>

#include "tileattn/forward.hpp"

extern "C" {
struct DispatchCase {
  long batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int causal;
  int score_options;  // 0: none; 1: soft-capping 20, ALiBi slopes 2^-(h+1), sinks 0.5 h
};
enum DispatchType { dispatch_fp32 = 0, dispatch_bf16 = 1, dispatch_fp16 = 2 };

/// tileattn::active_isa() of the -march=native build.
const char* dispatch_reference_isa();
/// tileattn::forward of the -march=native build on bshd q, k, v (elements of `type`), into o
/// and lse ([batch, heads_q, seqlen_q]), one thread, with dispatch_options(c) applied.
void dispatch_reference_forward(int type, const void* q, const void* k, const void* v, void* o, float* lse,
                                const DispatchCase* c);
}

/// The options a case asks for, the same in both builds (slopes and sinks in `storage`).
inline tileattn::ForwardOptions dispatch_options(const DispatchCase& c, std::vector<float>& storage) {
  tileattn::ForwardOptions opts;
  opts.causal = c.causal != 0;
  opts.execution = {tileattn::Backend::serial, 1};
  if (c.score_options) {
    storage.assign(static_cast<std::size_t>(2 * c.heads_q), 0.0f);
    for (long h = 0; h < c.heads_q; ++h) {
      storage[static_cast<std::size_t>(h)] = std::ldexp(1.0f, -static_cast<int>(h + 1));
      storage[static_cast<std::size_t>(c.heads_q + h)] = 0.5f * static_cast<float>(h);
    }
    opts.softcap = 20.0f;
    opts.alibi_slopes = std::span<const float>(storage.data(), static_cast<std::size_t>(c.heads_q));
    opts.sinks = std::span<const float>(storage.data() + c.heads_q, static_cast<std::size_t>(c.heads_q));
  }
  return opts;
}
