// python/src/paged.cpp: tileattn._C's paged-cache calls as vLLM passes them (raw page pools,
// block tables, sequence lengths, slot mappings) and merge_states. 8-bit pools: int8 arrays,
// or uint8 arrays with kv_format "fp8_e4m3" / "fp8_e5m2" naming what their bytes hold.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "dispatch.hpp"
#include "options.hpp"
#include "tileattn/cache_write.hpp"
#include "tileattn/merge_states.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::python {

namespace {

/// Calls f(Q{}, KV{}) with Q from q's array and KV from the pool's (and kv_format): the
/// combinations the extension compiles.
template <class QA, class PA, class F>
void with_paged_types(const QA& q, const PA& pool, const std::string& kv_format, F&& f,
                      const char* name_of_q = "q") {
  const Element qe = element_of(q), ke = element_of(pool);
  if (!kv_format.empty() && kv_format != "fp8_e4m3" && kv_format != "fp8_e5m2")
    throw invalid_argument("kv_format", "must be \"\", \"fp8_e4m3\" or \"fp8_e5m2\", got \"" + kv_format + "\"");
  if (ke == Element::uint8 && kv_format.empty())
    throw invalid_argument("kv_format", "must name the fp8 format (fp8_e4m3 or fp8_e5m2) of a uint8 cache");
  if (ke != Element::uint8 && !kv_format.empty())
    throw invalid_argument("kv_format", "is only for uint8 caches (fp8 bytes), the cache holds " +
                                            std::string(element_name(ke)));
  with_storage_type(q, name_of_q, [](auto) {});  // q's (or k_new's) type first: the one named if bad
  const std::string of_q = std::string(name_of_q) + "'s";
  if (ke == qe) return with_storage_type(q, name_of_q, [&](auto t) { f(t, t); });
  if (qe != Element::float32)
    throw invalid_argument("k_cache", "must hold " + of_q + " type (" + element_name(qe) + "), got " +
                                          element_name(ke) + " (8-bit caches take float32 " + name_of_q + ")");
  if (ke == Element::int8) return f(float{}, std::int8_t{});
  if (ke == Element::uint8 && kv_format == "fp8_e4m3") return f(float{}, fp8_e4m3{});
  if (ke == Element::uint8 && kv_format == "fp8_e5m2") return f(float{}, fp8_e5m2{});
  throw invalid_argument("k_cache", "must hold float32, int8 or fp8 bytes (uint8) for float32 " +
                                        std::string(name_of_q) + ", got " + element_name(ke));
}

void forward_paged(const InArray& q, const InArray& k_cache, const InArray& v_cache, const InArray& block_table,
                   const InArray& cache_seqlens, const OutArray& o, const OptionalOut& lse, const Options& options,
                   const std::string& kv_format) {
  with_paged_types(q, k_cache, kv_format, [&](auto t, auto kv) {
    using T = decltype(t);
    using KV = decltype(kv);
    const auto qv = view_of<const T, 4>(q, "q");
    const auto kc = view_of<const KV, 4>(k_cache, "k_cache");
    const auto vc = view_of<const KV, 4>(v_cache, "v_cache");
    const auto table = view_of<const std::int32_t, 2>(block_table, "block_table");
    const std::optional<InArray> lens = cache_seqlens;
    const auto seqlens = span_of<const std::int32_t>(lens, "cache_seqlens");
    const auto ov = view_of<T, 4>(o, "o");
    const auto lv = view_of<float, 3>(lse, "lse");
    const PagedOptions p = paged_options(options);
    nb::gil_scoped_release release;
    tileattn::forward_paged(qv, kc, vc, table, seqlens, ov, lv, p);
  });
}

void write_kv_slots(const InArray& k_new, const InArray& v_new, const OutArray& k_cache, const OutArray& v_cache,
                    const InArray& slot_mapping, const OptionalOut& k_scale, const OptionalOut& v_scale,
                    const std::string& kv_format) {
  const std::optional<InArray> slots_array = slot_mapping;
  const auto slots = span_of<const std::int64_t>(slots_array, "slot_mapping");
  with_paged_types(k_new, k_cache, kv_format, [&](auto t, auto kv) {
    using T = decltype(t);
    using KV = decltype(kv);
    const auto kn = view_of<const T, 3>(k_new, "k_new");
    const auto vn = view_of<const T, 3>(v_new, "v_new");
    const auto kc = view_of<KV, 4>(k_cache, "k_cache");
    const auto vc = view_of<KV, 4>(v_cache, "v_cache");
    if constexpr (quantized_type<KV>) {
      const auto ks = view_of<float, 2>(k_scale, "k_scale");
      const auto vs = view_of<float, 2>(v_scale, "v_scale");
      nb::gil_scoped_release release;
      tileattn::write_kv_slots(kn, vn, kc, vc, slots, ks, vs);
    } else {
      if (k_scale || v_scale) throw invalid_argument(k_scale ? "k_scale" : "v_scale", "is only for 8-bit caches");
      nb::gil_scoped_release release;
      tileattn::write_kv_slots(kn, vn, kc, vc, slots);
    }
  }, "k_new");
}

void merge_states(const InArray& o_a, const InArray& lse_a, const InArray& o_b, const InArray& lse_b,
                  const OutArray& o, const OptionalOut& lse, int num_threads) {
  with_storage_type(o_a, "o_a", [&](auto t) {
    using T = decltype(t);
    const auto a = view_of<const T, 4>(o_a, "o_a");
    const auto b = view_of<const T, 4>(o_b, "o_b");
    const auto la = view_of<const float, 3>(lse_a, "lse_a");
    const auto lb = view_of<const float, 3>(lse_b, "lse_b");
    const auto ov = view_of<T, 4>(o, "o");
    const auto lv = view_of<float, 3>(lse, "lse");
    Execution execution;
    execution.num_threads = num_threads;
    nb::gil_scoped_release release;
    tileattn::merge_states<T>(a, la, b, lb, ov, lv, execution);
  });
}

}  // namespace

void bind_paged(nb::module_& m) {
  using namespace nb::literals;
  m.def("forward_paged", &forward_paged, "q"_a, "k_cache"_a, "v_cache"_a, "block_table"_a, "cache_seqlens"_a, "o"_a,
        "lse"_a.none(), "options"_a, "kv_format"_a = "",
        "Attention of q [batch, seqlen_q, heads_q, head_dim] to paged K/V pools [num_pages, page_size, "
        "heads_kv, head_dim] through block_table [batch, max_pages] (int32) and cache_seqlens [batch] (int32).");
  m.def("write_kv_slots", &write_kv_slots, "k_new"_a, "v_new"_a, "k_cache"_a, "v_cache"_a, "slot_mapping"_a,
        "k_scale"_a.none() = nb::none(), "v_scale"_a.none() = nb::none(), "kv_format"_a = "",
        "Writes token i's K/V rows into slot slot_mapping[i] (int64; -1 skips) of the pools.");
  m.def("merge_states", &merge_states, "o_a"_a, "lse_a"_a, "o_b"_a, "lse_b"_a, "o"_a, "lse"_a.none(),
        "num_threads"_a = 0, "Merges two partial results over disjoint keys by their LSEs.");
}

}  // namespace tileattn::python
