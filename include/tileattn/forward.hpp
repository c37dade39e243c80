// tileattn/forward.hpp: the public forward pass: tileattn::forward() over strided views.
//
//   std::vector<float> q(B*N*H*D), k(...), v(...), o(...), lse(B*H*N);
//   tileattn::ForwardOptions opts;  opts.causal = true;
//   tileattn::forward(tileattn::make_bshd(q.data(), B, N, H, D),
//                     tileattn::make_bshd(k.data(), B, N, H, D),
//                     tileattn::make_bshd(v.data(), B, N, H, D),
//                     tileattn::make_bshd(o.data(), B, N, H, D),
//                     tileattn::make_lse(lse.data(), B, H, N), opts);
//
// Every argument is checked before anything runs: a bad one throws
// tileattn::invalid_argument naming it, and nothing is written.
#pragma once

#include <cmath>
#include <string>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/detail/view_checks.hpp"
#include "tileattn/kernels/forward.hpp"
#include "tileattn/kernels/head_dim_dispatch.hpp"
#include "tileattn/kernels/tile_plan.hpp"
#include "tileattn/memory/cache_size.hpp"

namespace tileattn {

/// The SRAM budget a call with these options runs under.
inline std::size_t effective_sram_budget(const ForwardOptions& options) {
  return options.sram_budget_bytes ? options.sram_budget_bytes : per_core_cache_bytes();
}

/// The tile plan forward() uses for these sizes and options.
inline TilePlan plan_forward(index_t head_dim, index_t seqlen_q, index_t seqlen_k,
                             const ForwardOptions& options = {}) {
  return plan_forward_tiles(head_dim, seqlen_q, seqlen_k, effective_sram_budget(options));
}

namespace detail {

inline constexpr std::array<const char*, 4> qkv_dims{"batch", "seqlen", "heads", "head_dim"};
inline constexpr std::array<const char*, 3> lse_dims{"batch", "heads", "seqlen_q"};

template <class T>
void check_forward(const ForwardParams<T>& p, const ForwardOptions& options) {
  check_view(p.q, "q", qkv_dims);
  check_view(p.k, "k", qkv_dims);
  check_view(p.v, "v", qkv_dims);
  check_view(p.o, "o", qkv_dims);
  for (int d : {dim::batch, dim::heads, dim::head_dim})
    check_same_extent(p.q, "q", p.k, "k", d, qkv_dims[d]);
  for (int d = 0; d < 4; ++d) check_same_extent(p.k, "k", p.v, "v", d, qkv_dims[d]);
  for (int d = 0; d < 4; ++d) check_same_extent(p.q, "q", p.o, "o", d, qkv_dims[d]);
  require(head_dim_supported(p.head_dim()), "head_dim",
          std::to_string(p.head_dim()) + " is not supported (supported: 32, 64, 80, 96, 128, 256)");
  check_no_self_overlap(p.o, "o");
  check_disjoint(p.o, "o", p.q, "q");
  check_disjoint(p.o, "o", p.k, "k");
  check_disjoint(p.o, "o", p.v, "v");
  if (p.lse.data) {
    check_view(p.lse, "lse", lse_dims);
    check_same_extent(p.q, "q", p.lse, "lse", 0, "batch");
    require(p.lse.shape[1] == p.heads(), dim_name("lse", "shape", 1, "heads"),
            "must equal q's heads = " + std::to_string(p.heads()));
    require(p.lse.shape[2] == p.seqlen_q(), dim_name("lse", "shape", 2, "seqlen_q"),
            "must equal q's seqlen = " + std::to_string(p.seqlen_q()));
    check_no_self_overlap(p.lse, "lse");
    check_disjoint(p.lse, "lse", p.q, "q");
    check_disjoint(p.lse, "lse", p.k, "k");
    check_disjoint(p.lse, "lse", p.v, "v");
    check_disjoint(p.lse, "lse", p.o, "o");
  }
  require(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f, "softmax_scale",
          "must be finite and > 0, got " + std::to_string(p.softmax_scale));
  validate_execution(options.execution);
}

}  // namespace detail

/// O = softmax(scale * Q K^T [causal mask]) V for every (batch, head), and, when lse.data
/// is set, lse = log(sum_j exp(scale * q_i . k_j)) per row.
inline void forward(TensorView<const float> q, TensorView<const float> k,
                    TensorView<const float> v, TensorView<float> o, LseView lse,
                    const ForwardOptions& options = {}) {
  const float scale = options.softmax_scale.value_or(
      q.shape[dim::head_dim] > 0 ? 1.0f / std::sqrt(static_cast<float>(q.shape[dim::head_dim]))
                                 : 1.0f);
  const ForwardParams<float> params{q, k, v, o, lse, scale, options.causal};
  detail::check_forward(params, options);
  const TilePlan plan = plan_forward(params.head_dim(), params.seqlen_q(), params.seqlen_k(), options);
  detail::dispatch_head_dim(params.head_dim(), [&](auto head_dim) {
    constexpr index_t D = decltype(head_dim)::value;
    if (options.io_counts) {
      *options.io_counts = kernels::run_forward<D, CountingIo>(params, plan, options.execution);
    } else {
      kernels::run_forward<D, NoIoCounting>(params, plan, options.execution);
    }
  });
}

/// forward() without the log-sum-exp output.
inline void forward(TensorView<const float> q, TensorView<const float> k,
                    TensorView<const float> v, TensorView<float> o,
                    const ForwardOptions& options = {}) {
  forward(q, k, v, o, LseView{}, options);
}

}  // namespace tileattn
