// tests/kernels/backward_validation_test.cpp: argument checking of tileattn::backward and
// backward_varlen (backward.hpp, detail/backward_checks.hpp): every bad argument throws
// tileattn::invalid_argument (budget_error for the SRAM budget) naming the parameter, and
// nothing is written: dQ, dK, dV, dsinks, dbias and the IO counts keep their sentinels.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <span>
#include <tuple>
#include <vector>

#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

/// A valid backward call (B 2, Nq 5, Nk 7, 4/2 heads, d 16, dv 8) whose arguments a test breaks.
struct Call {
  static constexpr index_t B = 2, nq = 5, nk = 7, H = 4, Hkv = 2, d = 16, dv = 8;
  HostTensor q{{B, nq, H, d}, Layout::bshd}, k{{B, nk, Hkv, d}, Layout::bshd}, v{{B, nk, Hkv, dv}, Layout::bshd};
  HostTensor o{{B, nq, H, dv}, Layout::bshd}, dout{{B, nq, H, dv}, Layout::bshd};
  HostTensor dq{{B, nq, H, d}, Layout::bshd}, dk{{B, nk, Hkv, d}, Layout::bshd}, dv_{{B, nk, Hkv, dv}, Layout::bshd};
  HostLse lse{B, H, nq};
  std::vector<float> sinks{0.5f, -1.0f, 0.25f, 2.0f}, dsinks = std::vector<float>(H, sentinel);
  std::vector<float> bias = std::vector<float>(static_cast<std::size_t>(H * nq * nk), 0.1f);
  std::vector<float> dbias = std::vector<float>(static_cast<std::size_t>(H * nq * nk), sentinel);
  IoCounts counts{7, 7};
  BackwardOptions opts;
  TensorView<const float> qv, kv, vv, ov, dov;
  TensorView<float> dqv, dkv, dvv;
  SavedLseView lv;

  Call() {
    q.fill_normal(1);
    k.fill_normal(2);
    v.fill_normal(3);
    dout.fill_normal(4);
    opts.io_counts = &counts;
    qv = q.cview(), kv = k.cview(), vv = v.cview(), ov = o.cview(), dov = dout.cview();
    forward(qv, kv, vv, o.view(), lse.view(), opts);
    dq.fill(sentinel), dk.fill(sentinel), dv_.fill(sentinel);
    counts = {7, 7};
    dqv = dq.view(), dkv = dk.view(), dvv = dv_.view();
    lv = lse.view();
  }
  void with_sinks() {
    opts.sinks = sinks;
    opts.dsinks = dsinks;
  }
  void with_bias() {  // [1, H, nq, nk]: broadcast over the batch
    opts.bias = {bias.data(), {1, H, nq, nk}, {0, nq * nk, nk, 1}};
    opts.dbias = {dbias.data(), {1, H, nq, nk}, {0, nq * nk, nk, 1}};
  }
  void run() { backward(qv, kv, vv, ov, lv, dov, dqv, dkv, dvv, opts); }
  bool untouched() const {
    return all_equal(dq.buffer(), sentinel) && all_equal(dk.buffer(), sentinel) && all_equal(dv_.buffer(), sentinel) &&
           all_equal(dsinks, sentinel) && all_equal(dbias, sentinel) && counts == IoCounts{7, 7};
  }
};

bool names(const std::string& got, const std::string& parameter) {
  return got == parameter || got.rfind(parameter + " (", 0) == 0;
}

void expect_rejected(const std::function<void(Call&)>& breakit, const std::string& parameter) {
  Call c;
  breakit(c);
  try {
    c.run();
    ADD_FAILURE() << "backward accepted the call; expected an error naming " << parameter;
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(names(e.parameter(), parameter)) << "named " << e.parameter() << ": " << e.what();
  }
  EXPECT_TRUE(c.untouched()) << "an output was written by a rejected call naming " << parameter;
}

TEST(BackwardValidation, AValidCallRunsAndWrites) {
  Call c;
  c.with_sinks();
  c.with_bias();
  c.run();
  EXPECT_FALSE(all_equal(c.dq.buffer(), sentinel));
  EXPECT_EQ(c.dq.changed_outside_view(sentinel), 0u);
  EXPECT_NE(c.dsinks[0], sentinel);
  EXPECT_NE(c.dbias[0], sentinel);
  EXPECT_GT(c.counts.bytes_read, 7u);
}

TEST(BackwardValidation, GradientAndDoutShapesMustMatchTheirTensors) {
  expect_rejected([](Call& c) { c.dov.shape[1] = 4; }, "dout.shape[1]");
  expect_rejected([](Call& c) { c.dov.shape[3] = Call::d; }, "dout.shape[3]");
  expect_rejected([](Call& c) { c.dqv.shape[3] = Call::dv; }, "dq.shape[3]");
  expect_rejected([](Call& c) { c.dqv.shape[2] = 2; }, "dq.shape[2]");
  expect_rejected([](Call& c) { c.dkv.shape[1] = 6; }, "dk.shape[1]");
  expect_rejected([](Call& c) { c.dvv.shape[3] = Call::d; }, "dv.shape[3]");
  expect_rejected([](Call& c) { c.dvv.shape[0] = 1; }, "dv.shape[0]");
  expect_rejected([](Call& c) { c.ov.shape[1] = 6; }, "o.shape[1]");
  expect_rejected([](Call& c) { c.dqv.data = nullptr; }, "dq");
  expect_rejected([](Call& c) { c.dkv.stride[1] = -1; }, "dk.stride[1]");
}

TEST(BackwardValidation, TheSavedLseIsRequiredWithTheForwardsShape) {
  expect_rejected([](Call& c) { c.lv.data = nullptr; }, "lse");
  expect_rejected([](Call& c) { c.lv.shape[2] = 4; }, "lse.shape[2]");
  expect_rejected([](Call& c) { c.lv.shape[1] = 2; }, "lse.shape[1]");
}

TEST(BackwardValidation, GradientsMustNotAliasInputsOrEachOther) {
  expect_rejected([](Call& c) { c.dqv.data = const_cast<float*>(c.qv.data); }, "dq");
  expect_rejected([](Call& c) { c.dkv.data = c.dqv.data; }, "dk");
  expect_rejected([](Call& c) { c.dvv.data = const_cast<float*>(c.dov.data); }, "dv");
  expect_rejected([](Call& c) { c.dvv.data = const_cast<float*>(c.ov.data); }, "dv");
  expect_rejected([](Call& c) { c.dvv.data = c.dkv.data + 1; }, "dv");
  expect_rejected([](Call& c) { c.dqv.stride[1] = 0; }, "dq.stride");
}

TEST(BackwardValidation, ExtraGradientsNeedTheirParameters) {
  expect_rejected([](Call& c) { c.opts.dsinks = c.dsinks; }, "dsinks");
  expect_rejected([](Call& c) { c.with_sinks(); c.opts.dsinks = std::span<float>(c.dsinks).first(3); }, "dsinks");
  expect_rejected([](Call& c) { c.with_sinks(); c.opts.dsinks = {c.sinks.data(), c.sinks.size()}; }, "dsinks");
  expect_rejected([](Call& c) { c.with_bias(); c.opts.bias = {}; }, "dbias");
  expect_rejected([](Call& c) { c.with_bias(); c.opts.dbias.shape[1] = 1; }, "dbias.shape[1]");
  expect_rejected([](Call& c) { c.with_bias(); c.opts.dbias.data = c.bias.data(); }, "dbias");
  expect_rejected([](Call& c) { c.with_bias(); c.opts.dbias.data = c.dqv.data; }, "dbias");
}

TEST(BackwardValidation, ForwardOptionsAreCheckedAsTheForwardChecksThem) {
  expect_rejected([](Call& c) { c.opts.softmax_scale = -1.0f; }, "softmax_scale");
  expect_rejected([](Call& c) { c.opts.window_left = -2; }, "window_left");
  expect_rejected([](Call& c) { c.opts.sinks = std::span<const float>(c.sinks).first(2); }, "sinks");
  expect_rejected([](Call& c) { c.opts.sram_budget_bytes = 256; }, "sram_budget_bytes");
  expect_rejected([](Call& c) { c.opts.execution.num_threads = -1; }, "num_threads");
}

TEST(BackwardValidation, VarlenChecksCuSeqlensAndShapes) {
  const index_t total_q = 9, total_k = 11, H = 2, d = 8;
  std::vector<float> q(total_q * H * d, 0.5f), k(total_k * H * d, 0.25f), v(k.size(), 1.0f), o(q.size(), 0.0f),
      dout(q.size(), 1.0f), lse(H * total_q, 0.0f);
  std::vector<float> dq(q.size(), sentinel), dk(k.size(), sentinel), dv(v.size(), sentinel);
  std::vector<std::int32_t> cq{0, 4, 9}, ck{0, 6, 11};
  VarlenSequences seqs{cq, ck, 5, 6};
  const auto run = [&](VarlenSequences s, index_t dq_rows) {
    backward_varlen(make_thd<const float>(q.data(), total_q, H, d), make_thd<const float>(k.data(), total_k, H, d),
                    make_thd<const float>(v.data(), total_k, H, d), make_thd<const float>(o.data(), total_q, H, d),
                    SavedPackedLseView{lse.data(), {H, total_q}, {total_q, 1}},
                    make_thd<const float>(dout.data(), total_q, H, d), make_thd(dq.data(), dq_rows, H, d),
                    make_thd(dk.data(), total_k, H, d), make_thd(dv.data(), total_k, H, d), s);
  };
  const auto rejected = [&](VarlenSequences s, index_t dq_rows, const std::string& parameter) {
    try {
      run(s, dq_rows);
      ADD_FAILURE() << "accepted; expected " << parameter;
    } catch (const invalid_argument& e) {
      EXPECT_TRUE(names(e.parameter(), parameter)) << e.what();
    }
    EXPECT_TRUE(all_equal(dq, sentinel) && all_equal(dk, sentinel) && all_equal(dv, sentinel));
  };
  std::vector<std::int32_t> bad{0, 5, 4};
  rejected({bad, ck, 5, 6}, total_q, "cu_seqlens_q");
  rejected({cq, ck, 4, 6}, total_q, "max_seqlen_q");
  rejected(seqs, total_q - 1, "dq.shape[0]");
  run(seqs, total_q);
  EXPECT_FALSE(all_equal(dq, sentinel));
}

/// A valid backward_varlen call (2 sequences: 4 and 5 queries, 6 and 5 keys; H 2, d 8) with
/// sinks and a bias, whose cu_seqlens a test moves into a gradient's memory.
struct VarlenCall {
  static constexpr index_t total_q = 9, total_k = 11, H = 2, d = 8, max_q = 5, max_k = 6;
  std::vector<float> q = std::vector<float>(total_q * H * d, 0.5f), k = std::vector<float>(total_k * H * d, 0.25f);
  std::vector<float> v = std::vector<float>(k.size(), 1.0f), o = std::vector<float>(q.size(), 0.0f);
  std::vector<float> dout = std::vector<float>(q.size(), 1.0f), lse = std::vector<float>(H * total_q, 0.0f);
  std::vector<float> sinks{0.5f, -1.0f}, bias = std::vector<float>(H * max_q * max_k, 0.1f);
  std::vector<float> dq = std::vector<float>(q.size(), sentinel), dk = std::vector<float>(k.size(), sentinel);
  std::vector<float> dv = std::vector<float>(v.size(), sentinel), dsinks = std::vector<float>(8, sentinel);
  std::vector<float> dbias = std::vector<float>(bias.size(), sentinel);
  std::vector<std::int32_t> cq{0, 4, 9}, ck{0, 6, 11};
  std::span<const std::int32_t> cu_q = cq, cu_k = ck;
  BackwardOptions opts;

  VarlenCall() {
    opts.sinks = sinks;
    opts.dsinks = std::span<float>(dsinks).first(H);
    opts.bias = {bias.data(), {1, H, max_q, max_k}, {0, max_q * max_k, max_k, 1}};
    opts.dbias = {dbias.data(), {1, H, max_q, max_k}, {0, max_q * max_k, max_k, 1}};
  }
  /// Copies `cu` to element `at` of `buffer` (an output) and points `cu` at the copy.
  static void move_into(std::span<const std::int32_t>& cu, std::vector<float>& buffer, std::size_t at) {
    std::memcpy(buffer.data() + at, cu.data(), cu.size() * sizeof(std::int32_t));
    cu = {reinterpret_cast<const std::int32_t*>(buffer.data() + at), cu.size()};
  }
  void run() {
    backward_varlen(make_thd<const float>(q.data(), total_q, H, d), make_thd<const float>(k.data(), total_k, H, d),
                    make_thd<const float>(v.data(), total_k, H, d), make_thd<const float>(o.data(), total_q, H, d),
                    SavedPackedLseView{lse.data(), {H, total_q}, {total_q, 1}},
                    make_thd<const float>(dout.data(), total_q, H, d), make_thd(dq.data(), total_q, H, d),
                    make_thd(dk.data(), total_k, H, d), make_thd(dv.data(), total_k, H, d),
                    VarlenSequences{cu_q, cu_k, max_q, max_k}, opts);
  }
  std::vector<std::vector<float>> outputs() const { return {dq, dk, dv, dsinks, dbias}; }
};

// Issue 27, N1: the kernel reads cu_seqlens while it writes the gradients, so lengths stored
// in a gradient's memory were read back as float bits (an assertion, a budget_error after
// partial writes, or silent acceptance). Each output against each length array.
TEST(BackwardValidation, VarlenGradientsMustNotOverlapCuSeqlens) {
  const auto cases = std::vector<std::tuple<const char*, bool, std::vector<float> VarlenCall::*, std::size_t>>{
      {"dq", true, &VarlenCall::dq, 0},       {"dq", false, &VarlenCall::dq, 40},
      {"dk", false, &VarlenCall::dk, 5},      {"dk", true, &VarlenCall::dk, 100},
      {"dv", true, &VarlenCall::dv, 170},     {"dsinks", false, &VarlenCall::dsinks, 1},
      {"dbias", true, &VarlenCall::dbias, 57}};
  for (const auto& [output, is_q, buffer, at] : cases) {
    SCOPED_TRACE(std::string(is_q ? "cu_seqlens_q" : "cu_seqlens_k") + " in " + output);
    VarlenCall c;
    VarlenCall::move_into(is_q ? c.cu_q : c.cu_k, c.*buffer, at);
    const auto before = c.outputs();
    try {
      c.run();
      ADD_FAILURE() << "backward_varlen accepted the call";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), output) << e.what();
      EXPECT_NE(std::string(e.what()).find(is_q ? "cu_seqlens_q" : "cu_seqlens_k"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c.outputs() == before) << "a gradient (or the lengths in it) was written";
  }
  VarlenCall valid;
  valid.run();
  EXPECT_FALSE(all_equal(valid.dq, sentinel));
}

// backward(plan, ...): the bits of the planned call, and "plan" for another call's plan.
TEST(BackwardPlanReuse, SameBitsForItsCallAndRejectsAnother) {
  Call planned, direct;
  const BackwardPlan plan = plan_backward(planned.qv, planned.kv, planned.vv, planned.opts);
  backward(plan, planned.qv, planned.kv, planned.vv, planned.ov, planned.lv, planned.dov, planned.dqv, planned.dkv,
           planned.dvv, planned.opts);
  direct.run();
  EXPECT_TRUE(bitwise_equal(planned.dq.buffer(), direct.dq.buffer()));
  EXPECT_TRUE(bitwise_equal(planned.dk.buffer(), direct.dk.buffer()));
  EXPECT_TRUE(bitwise_equal(planned.dv_.buffer(), direct.dv_.buffer()));
  for (const auto& change : std::vector<std::function<void(Call&)>>{
           [](Call& c) { c.opts.sram_budget_bytes = 64 * 1024; },
           [](Call& c) { c.opts.softcap = 30.0f; },  // the slope takes a tile of its own
           [](Call& c) { c.opts.execution = {Backend::openmp, 3}; }}) {
    Call c;
    change(c);
    try {
      backward(plan, c.qv, c.kv, c.vv, c.ov, c.lv, c.dov, c.dqv, c.dkv, c.dvv, c.opts);
      ADD_FAILURE() << "a plan made for another call was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.parameter(), "plan") << e.what();
    }
    EXPECT_TRUE(c.untouched()) << "an output was written before the error";
  }
}

}  // namespace
}  // namespace tileattn::test
