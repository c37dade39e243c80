// tests/kernels/forward_validation_test.cpp: argument checking of tileattn::forward (forward.hpp,
// detail/forward_checks.hpp, detail/view_checks.hpp): every bad argument throws
// tileattn::invalid_argument (budget_error for the SRAM budget) naming the parameter, and
// nothing is written: O, LSE and the IO counts keep their sentinels.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

/// A valid forward call (B 2, Nq 5, Nk 7, 4 heads) whose views a test then breaks.
struct Call {
  static constexpr index_t B = 2, nq = 5, nk = 7, H = 4;
  index_t d;
  HostTensor q, k, v, o;
  HostLse lse;
  IoCounts counts{7, 7};
  ForwardOptions opts;
  TensorView<const float> qv, kv, vv;
  TensorView<float> ov;
  LseView lv;

  explicit Call(index_t head_dim = 32)
      : d(head_dim),
        q({B, nq, H, head_dim}, Layout::bshd),
        k({B, nk, H, head_dim}, Layout::bshd),
        v({B, nk, H, head_dim}, Layout::bshd),
        o({B, nq, H, head_dim}, Layout::bshd),
        lse(B, H, nq) {
    q.fill_normal(1);
    k.fill_normal(2);
    v.fill_normal(3);
    o.fill(sentinel);
    lse.fill(sentinel);
    opts.io_counts = &counts;
    qv = q.cview();
    kv = k.cview();
    vv = v.cview();
    ov = o.view();
    lv = lse.view();
  }

  void run() { forward(qv, kv, vv, ov, lv, opts); }
};

/// `parameter` matches exactly, or is the start of a name such as "k.shape[2] (heads)".
bool names(const std::string& got, const std::string& parameter) {
  return got == parameter || got.rfind(parameter + " (", 0) == 0;
}

void expect_rejected(Call& c, const std::string& parameter, bool budget = false) {
  try {
    c.run();
    ADD_FAILURE() << "forward accepted the call; expected an error naming " << parameter;
  } catch (const budget_error& e) {
    EXPECT_TRUE(budget) << "unexpected budget_error: " << e.what();
    EXPECT_TRUE(names(e.parameter(), parameter))
        << "parameter() is \"" << e.parameter() << "\", expected \"" << parameter << "\"";
  } catch (const invalid_argument& e) {
    EXPECT_FALSE(budget) << "expected budget_error, got invalid_argument: " << e.what();
    EXPECT_TRUE(names(e.parameter(), parameter))
        << "parameter() is \"" << e.parameter() << "\", expected \"" << parameter << "\"; what(): " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("tileattn: " + e.parameter() + ": ", 0), 0u) << e.what();
  }
  EXPECT_TRUE(all_equal(c.o.buffer(), sentinel)) << "O was written before the error";
  EXPECT_TRUE(all_equal(c.lse.buffer(), sentinel)) << "LSE was written before the error";
  EXPECT_EQ(c.counts, (IoCounts{7, 7})) << "io_counts was written before the error";
}

struct BadCase {
  std::string name;
  std::function<void(Call&)> mutate;
  std::string parameter;
  bool budget = false;
};

std::vector<BadCase> bad_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<BadCase> cases{
      // null data
      {"null_q", [](Call& c) { c.qv.data = nullptr; }, "q"},
      {"null_k", [](Call& c) { c.kv.data = nullptr; }, "k"},
      {"null_v", [](Call& c) { c.vv.data = nullptr; }, "v"},
      {"null_o", [](Call& c) { c.ov.data = nullptr; }, "o"},
      // zero sizes
      {"zero_batch", [](Call& c) { c.qv.shape[0] = 0; }, "q.shape[0]"},
      {"zero_seqlen_q", [](Call& c) { c.qv.shape[1] = 0; }, "q.shape[1]"},
      {"zero_seqlen_k", [](Call& c) { c.kv.shape[1] = 0; }, "k.shape[1]"},
      {"zero_heads", [](Call& c) { c.qv.shape[2] = 0; }, "q.shape[2]"},
      {"zero_head_dim_v", [](Call& c) { c.vv.shape[3] = 0; }, "v.shape[3]"},
      {"zero_lse_seqlen", [](Call& c) { c.lv.shape[2] = 0; }, "lse.shape[2]"},
      // negative strides
      {"negative_k_seqlen_stride", [](Call& c) { c.kv.stride[1] = -c.kv.stride[1]; }, "k.stride[1]"},
      {"negative_q_head_dim_stride", [](Call& c) { c.qv.stride[3] = -1; }, "q.stride[3]"},
      {"negative_o_batch_stride", [](Call& c) { c.ov.stride[0] = -c.ov.stride[0]; }, "o.stride[0]"},
      {"negative_lse_stride", [](Call& c) { c.lv.stride[1] = -1; }, "lse.stride[1]"},
      // mismatched shapes
      {"k_heads_not_dividing_q_heads", [](Call& c) { c.kv.shape[2] = 3; c.vv.shape[2] = 3; }, "k.shape[2]"},
      {"k_batch", [](Call& c) { c.kv.shape[0] = 1; c.vv.shape[0] = 1; }, "k.shape[0]"},
      {"k_head_dim", [](Call& c) { c.kv.shape[3] = 16; c.vv.shape[3] = 16; }, "k.shape[3]"},
      {"v_seqlen", [](Call& c) { c.vv.shape[1] = 6; }, "v.shape[1]"},
      {"v_heads", [](Call& c) { c.vv.shape[2] = 2; }, "v.shape[2]"},
      {"o_batch", [](Call& c) { c.ov.shape[0] = 1; }, "o.shape[0]"},
      {"o_seqlen", [](Call& c) { c.ov.shape[1] = 4; }, "o.shape[1]"},
      {"o_heads", [](Call& c) { c.ov.shape[2] = 2; }, "o.shape[2]"},
      {"o_head_dim", [](Call& c) { c.ov.shape[3] = 16; }, "o.shape[3]"},
      {"lse_batch", [](Call& c) { c.lv.shape[0] = 1; }, "lse.shape[0]"},
      {"lse_heads", [](Call& c) { c.lv.shape[1] = 3; }, "lse.shape[1]"},
      {"lse_seqlen", [](Call& c) { c.lv.shape[2] = 4; }, "lse.shape[2]"},
      // aliasing
      {"o_is_q", [](Call& c) { c.ov.data = c.q.buffer().data(); }, "o"},
      {"o_is_k", [](Call& c) { c.ov.data = c.k.buffer().data(); }, "o"},
      {"o_inside_v", [](Call& c) { c.ov.data = c.v.buffer().data() + 3; }, "o"},
      {"lse_inside_o", [](Call& c) { c.lv.data = c.o.buffer().data() + 1; }, "lse"},
      {"lse_inside_q", [](Call& c) { c.lv.data = c.q.buffer().data(); }, "lse"},
      {"o_zero_head_stride", [](Call& c) { c.ov.stride[2] = 0; }, "o.stride"},
      {"o_rows_interleaved", [](Call& c) { c.ov.stride[1] = 1; }, "o.stride"},
      {"lse_zero_stride", [](Call& c) { c.lv.stride[2] = 0; }, "lse.stride"},
      // softmax scale
      {"scale_nan", [=](Call& c) { c.opts.softmax_scale = nan; }, "softmax_scale"},
      {"scale_inf", [=](Call& c) { c.opts.softmax_scale = inf; }, "softmax_scale"},
      {"scale_zero", [](Call& c) { c.opts.softmax_scale = 0.0f; }, "softmax_scale"},
      {"scale_negative", [](Call& c) { c.opts.softmax_scale = -0.5f; }, "softmax_scale"},
      {"scale_times_log2e_overflows", [](Call& c) { c.opts.softmax_scale = 3e38f; }, "softmax_scale"},
      // execution
      {"threads_negative", [](Call& c) { c.opts.execution.num_threads = -1; }, "num_threads"},
      {"threads_100000", [](Call& c) { c.opts.execution.num_threads = 100000; }, "num_threads"},
      {"threads_above_max", [](Call& c) { c.opts.execution.num_threads = max_threads + 1; }, "num_threads"},
      // views whose sizes or address ranges overflow
      {"q_element_count_overflows", [](Call& c) { c.qv.shape[1] = index_t{1} << 62; }, "q"},
      {"k_stride_reach_overflows", [](Call& c) { c.kv.stride[1] = index_t{1} << 61; }, "k"},
      {"k_two_rows_span_past_ptrdiff_max",  // (2 - 1) * 2^61 floats = 2^63 bytes: fits int64, not an object
       [](Call& c) { c.kv.shape[1] = c.vv.shape[1] = 2; c.kv.stride[1] = index_t{1} << 61; }, "k"},
      {"v_bytes_past_address_space", [](Call& c) { c.vv.stride[0] = index_t{1} << 62; }, "v"},
      {"o_stride_reach_overflows", [](Call& c) { c.ov.stride[2] = index_t{1} << 62; }, "o"},
      {"lse_stride_reach_overflows", [](Call& c) { c.lv.stride[1] = index_t{1} << 62; }, "lse"},
      // SRAM budget
      {"budget_64_bytes", [](Call& c) { c.opts.sram_budget_bytes = 64; }, "sram_budget_bytes", true},
      {"budget_2_pow_40", [](Call& c) { c.opts.sram_budget_bytes = std::size_t{1} << 40; }, "sram_budget_bytes"},
      {"budget_2_pow_62", [](Call& c) { c.opts.sram_budget_bytes = std::size_t{1} << 62; }, "sram_budget_bytes"},
      {"budget_size_max", [](Call& c) { c.opts.sram_budget_bytes = SIZE_MAX; }, "sram_budget_bytes"},
      {"budget_above_max", [](Call& c) { c.opts.sram_budget_bytes = max_sram_budget_bytes + 1; }, "sram_budget_bytes"},
      {"budget_one_below_1x1",
       [](Call& c) { c.opts.sram_budget_bytes = forward_working_set_bytes(1, 1, 32) - 1; },
       "sram_budget_bytes", true},
      // options of the forward variants
      {"window_left_below_minus_1", [](Call& c) { c.opts.window_left = -2; }, "window_left"},
      {"window_right_below_minus_1", [](Call& c) { c.opts.window_right = -5; }, "window_right"},
      {"attention_chunk_negative", [](Call& c) { c.opts.attention_chunk = -1; }, "attention_chunk"},
      {"softcap_negative", [](Call& c) { c.opts.softcap = -1.0f; }, "softcap"},
      {"softcap_nan", [=](Call& c) { c.opts.softcap = nan; }, "softcap"},
      {"softcap_float_max", [](Call& c) { c.opts.softcap = std::numeric_limits<float>::max(); }, "softcap"},
      {"softcap_times_log2e_overflows", [](Call& c) { c.opts.softcap = 2.4e38f; }, "softcap"},
  };
  return cases;
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class ForwardRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(ForwardRejects, NamesTheParameterAndWritesNothing) {
  Call c;
  GetParam().mutate(c);
  expect_rejected(c, GetParam().parameter, GetParam().budget);
}

INSTANTIATE_TEST_SUITE_P(BadArguments, ForwardRejects, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ForwardRejection, HeadDimAboveTheLimit) {
  for (index_t d : {max_head_dim + 1, index_t{4096}}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    Call c(d);
    expect_rejected(c, "head_dim");
  }
}

TEST(ForwardRejection, ValueHeadDimAboveTheLimit) {
  Call c(32);
  HostTensor wide_v({Call::B, Call::nk, Call::H, max_head_dim + 1}, Layout::bshd);
  HostTensor wide_o({Call::B, Call::nq, Call::H, max_head_dim + 1}, Layout::bshd);
  wide_o.fill(sentinel);
  c.vv = wide_v.cview();
  c.ov = wide_o.view();
  try {
    c.run();
    ADD_FAILURE() << "accepted head_dim_v " << max_head_dim + 1;
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "head_dim_v");
  }
  EXPECT_TRUE(all_equal(wide_o.buffer(), sentinel));
}

TEST(ForwardRejection, BackendNotCompiledIn) {
  bool any_missing = false;
  for (Backend b : {Backend::openmp, Backend::tbb}) {
    if (backend_available(b)) continue;
    any_missing = true;
    SCOPED_TRACE(to_string(b));
    Call c;
    c.opts.execution.backend = b;
    expect_rejected(c, "backend");
  }
  if (!any_missing) GTEST_SKIP() << "every backend is compiled into this build";
}

TEST(ForwardRejection, BadAlibiSinksBiasMask) {
  {
    Call c;
    const std::vector<float> slopes(3, 0.5f);  // neither heads (4) nor batch * heads (8)
    c.opts.alibi_slopes = slopes;
    expect_rejected(c, "alibi_slopes");
  }
  {
    Call c;
    const std::vector<float> slopes{0.5f, std::numeric_limits<float>::infinity(), 0.1f, 0.2f};
    c.opts.alibi_slopes = slopes;
    expect_rejected(c, "alibi_slopes");
  }
  {
    Call c;
    const std::vector<float> sinks{0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
    c.opts.sinks = sinks;
    expect_rejected(c, "sinks");
  }
  {
    Call c;
    const std::vector<float> sinks(5, 0.0f);
    c.opts.sinks = sinks;
    expect_rejected(c, "sinks");
  }
  {
    Call c;
    std::vector<float> bias(static_cast<std::size_t>(Call::nq * Call::nk), 0.25f);
    c.opts.bias = {bias.data(), {1, 1, Call::nq, Call::nk + 1}, {0, 0, Call::nk, 1}};
    expect_rejected(c, "bias.shape[3]");
  }
  {
    Call c;
    std::vector<float> bias(static_cast<std::size_t>(Call::nq * Call::nk), 0.25f);
    c.opts.bias = {bias.data(), {3, 1, Call::nq, Call::nk}, {0, 0, Call::nk, 1}};  // batch 3 != 2
    expect_rejected(c, "bias.shape[0]");
  }
  {
    Call c;  // a bias living inside O's memory
    c.opts.bias = {c.o.buffer().data(), {1, 1, Call::nq, Call::nk}, {0, 0, Call::nk, 1}};
    expect_rejected(c, "o");
  }
  {
    Call c;
    std::unique_ptr<bool[]> mask(new bool[Call::nq * Call::nk]());
    c.opts.mask = {mask.get(), {1, 1, Call::nq, Call::nk}, {0, 0, -1, 1}};
    expect_rejected(c, "mask.stride[2]");
  }
  {
    Call c;  // an absurd bias stride names the bias, not "o overlaps bias"
    std::vector<float> bias(static_cast<std::size_t>(Call::nq * Call::nk), 0.25f);
    c.opts.bias = {bias.data(), {1, 1, Call::nq, Call::nk}, {0, 0, index_t{1} << 62, 1}};
    expect_rejected(c, "bias");
  }
}

// Float options whose value x * log2(e) (the kernels' units) would overflow are rejected by
// name; the largest accepted values give the reference's answer (ExtremeOptionValues in
// tests/variants/score_mods_test.cpp).
TEST(ForwardRejection, OptionValuesThatOverflowInLog2Units) {
  {
    Call c;
    const std::vector<float> sinks{0.0f, 3e38f, 0.0f, 0.0f};
    c.opts.sinks = sinks;
    expect_rejected(c, "sinks");
  }
  {
    Call c;  // |slope| * (Nq + Nk) must stay below max_natural_log_magnitude / 4
    const std::vector<float> slopes{0.5f, 0.5f, -1e37f, 0.5f};
    c.opts.alibi_slopes = slopes;
    expect_rejected(c, "alibi_slopes");
  }
}

TEST(ForwardRejection, ScaleMessageGivesItsBoundReadably) {  // issue 28: not as a 39-digit number
  Call c;
  c.opts.softmax_scale = 3e38f;
  try {
    c.run();
    ADD_FAILURE() << "accepted softmax_scale 3e38";
  } catch (const invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("at most 2.3586574e+38 "), std::string::npos) << message;
    EXPECT_NE(message.find("got 3e+38"), std::string::npos) << message;
  }
}

// ---- What must be accepted -------------------------------------------------------------------

TEST(ForwardAccepts, NullLseWritesOAndNothingElse) {
  Call c;
  c.lv = LseView{};
  c.run();
  EXPECT_TRUE(all_equal(c.lse.buffer(), sentinel));
  EXPECT_FALSE(all_equal(c.o.buffer(), sentinel));
  EXPECT_EQ(c.o.changed_outside_view(sentinel), 0u);
}

// Overlap is decided on the elements' address ranges: O ending right where K starts is
// fine, one element further is not.
TEST(ForwardAccepts, OutputAdjacentToAnInputButNotOverlapping) {
  Call c;
  const std::size_t o_size = c.o.buffer().size(), k_size = c.k.buffer().size();
  std::vector<float> shared(o_size + k_size, sentinel);
  std::copy(c.k.buffer().begin(), c.k.buffer().end(), shared.begin() + static_cast<std::ptrdiff_t>(o_size));
  c.ov.data = shared.data();
  c.kv.data = shared.data() + o_size;
  c.run();  // o = [0, o_size), k = [o_size, o_size + k_size): adjacent, accepted

  Call bad;
  std::vector<float> shared2(o_size + k_size, sentinel);
  bad.ov.data = shared2.data() + 1;  // o's last element is k's first
  bad.kv.data = shared2.data() + o_size;
  try {
    bad.run();
    ADD_FAILURE() << "an O overlapping K by one element was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "o");
  }
  EXPECT_TRUE(all_equal(shared2, sentinel));
}

TEST(ForwardAccepts, GroupedQueryHeadsAndDefaultExecution) {
  Call c;
  c.kv.shape[2] = 2;  // 4 query heads over 2 K/V heads
  c.vv.shape[2] = 2;
  c.opts.execution = {};
  c.run();
  EXPECT_EQ(c.o.changed_outside_view(sentinel), 0u);
  EXPECT_GT(c.counts.bytes_read, 0u);
}

TEST(ForwardErrors, BudgetErrorIsAnInvalidArgument) {
  Call c;
  c.opts.sram_budget_bytes = 1;
  EXPECT_THROW(c.run(), invalid_argument);
  EXPECT_THROW(c.run(), std::invalid_argument);
}

// A plan from plan_forward gives the call it was made for the same bits, and rejects,
// naming "plan", a call of another shape, budget or thread count before writing anything.
TEST(ForwardPlanReuse, SameBitsForItsCallAndRejectsAnother) {
  Call planned, direct;
  const ForwardPlan plan = plan_forward(planned.qv, planned.kv, planned.vv, planned.opts);
  EXPECT_EQ(plan.tiles().query_tile_rows, forward_tiles(plan.signature().shape, planned.opts).query_tile_rows);
  forward(plan, planned.qv, planned.kv, planned.vv, planned.ov, planned.lv, planned.opts);
  direct.run();
  EXPECT_TRUE(bitwise_equal(planned.o.buffer(), direct.o.buffer()));
  EXPECT_TRUE(bitwise_equal(planned.lse.buffer(), direct.lse.buffer()));

  const auto rejected = [&](const std::function<void(Call&)>& change) {
    Call c;
    change(c);
    try {
      forward(plan, c.qv, c.kv, c.vv, c.ov, c.lv, c.opts);
      ADD_FAILURE() << "a plan made for another call was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), "plan") << e.what();
    }
    EXPECT_TRUE(all_equal(c.o.buffer(), sentinel)) << "O was written before the error";
  };
  rejected([](Call& c) { c.opts.sram_budget_bytes = 64 * 1024; });
  rejected([](Call& c) { c.opts.execution = {Backend::openmp, 3}; });
  rejected([](Call& c) {  // 4 of the 5 query rows
    c.qv.shape[dim::seqlen] = 4;
    c.ov.shape[dim::seqlen] = 4;
    c.lv.shape[2] = 4;
  });
}

}  // namespace
}  // namespace tileattn::test
