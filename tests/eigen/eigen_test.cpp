// tests/eigen/eigen_test.cpp: tileattn/eigen.hpp. For float, Eigen::bfloat16 and Eigen::half:
// the forward called on Eigen tensors, TensorMaps, [b, h, s, d] tensors, and one head's
// row-major Matrix / Map / Block (outer strides > cols, an inner stride of 2) writes exactly
// the bytes the same forward writes through plain tileattn views of the same memory, and
// matches the double reference (reference::attention) within the type's tolerance. Plus the
// views' types (compile time), shapes and strides, and the bits the element mapping relies on.
// tests/eigen/compile_fail/ holds what must not compile (ColMajor, rank 3, ...).
#include <gtest/gtest.h>

#include <tileattn/eigen.hpp>
#include <tileattn/tileattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <cstdio>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference/naive_attention.hpp"

namespace {

namespace te = tileattn::eigen;
using tileattn::index_t;
using tileattn::LseView;
using tileattn::TensorView;

template <class S>
using Tensor4 = Eigen::Tensor<S, 4, Eigen::RowMajor>;
using Lse3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
template <class S>
using RowMatrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---- Compile-time: the view types --------------------------------------------------------

template <class X>
using view_t = decltype(te::view(std::declval<X>()));

static_assert(std::is_same_v<view_t<Tensor4<float>&>, TensorView<float>>);
static_assert(std::is_same_v<view_t<Tensor4<Eigen::bfloat16>&>, TensorView<tileattn::bf16>>);
static_assert(std::is_same_v<view_t<Tensor4<Eigen::half>&>, TensorView<tileattn::fp16>>);
static_assert(std::is_same_v<view_t<const Tensor4<Eigen::bfloat16>&>, TensorView<const tileattn::bf16>>);
static_assert(std::is_same_v<view_t<const Tensor4<float>&>, TensorView<const float>>);
static_assert(std::is_same_v<view_t<Eigen::TensorMap<Tensor4<Eigen::half>>>, TensorView<tileattn::fp16>>);
static_assert(std::is_same_v<view_t<const Eigen::TensorMap<Tensor4<Eigen::half>>&>, TensorView<tileattn::fp16>>);
static_assert(std::is_same_v<view_t<Eigen::TensorMap<const Tensor4<Eigen::half>>>, TensorView<const tileattn::fp16>>);
static_assert(std::is_same_v<decltype(te::view_bhsd(std::declval<Tensor4<Eigen::bfloat16>&>())),
                             TensorView<tileattn::bf16>>);
static_assert(std::is_same_v<view_t<RowMatrix<Eigen::bfloat16>&>, TensorView<tileattn::bf16>>);
static_assert(std::is_same_v<view_t<const RowMatrix<Eigen::half>&>, TensorView<const tileattn::fp16>>);
static_assert(std::is_same_v<view_t<Eigen::Map<RowMatrix<float>, 0, Eigen::OuterStride<>>>, TensorView<float>>);
static_assert(std::is_same_v<view_t<Eigen::Map<const RowMatrix<Eigen::bfloat16>>>, TensorView<const tileattn::bf16>>);
static_assert(std::is_same_v<view_t<Eigen::Ref<const RowMatrix<float>>>, TensorView<const float>>);
static_assert(std::is_same_v<decltype(te::lse_view(std::declval<Lse3&>())), LseView>);
static_assert(std::is_same_v<decltype(te::lse_view(std::declval<Eigen::VectorXf&>())), LseView>);
static_assert(std::is_same_v<te::element_t<Eigen::bfloat16>, tileattn::bf16>);
static_assert(std::is_same_v<te::element_t<const Eigen::half>, const tileattn::fp16>);
static_assert(std::is_same_v<te::element_t<float>, float>);
// A temporary Tensor or Matrix would leave the view dangling: no overload takes one.
template <class X>
concept viewable = requires(X&& x) { te::view(static_cast<X&&>(x)); };
static_assert(viewable<Tensor4<float>&> && !viewable<Tensor4<float>>);
static_assert(viewable<RowMatrix<float>&> && !viewable<RowMatrix<float>>);

// ---- Helpers -----------------------------------------------------------------------------

/// The tileattn element of Eigen scalar S, spelled independently of the header under test.
template <class S>
using Elem = std::conditional_t<std::is_same_v<S, float>, float,
                                std::conditional_t<std::is_same_v<S, Eigen::bfloat16>, tileattn::bf16, tileattn::fp16>>;

/// Plain tileattn view of the same bytes (what a user without eigen.hpp writes).
template <class S, int R>
auto plain(const tileattn::StridedView<S, R>& v) {
  return tileattn::reinterpret_view<Elem<std::remove_const_t<S>>>(v);
}

template <class S>
void fill_normal(S* data, index_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (index_t i = 0; i < n; ++i) data[i] = static_cast<S>(normal(rng));
}

template <class S>
S sentinel() {
  return static_cast<S>(1234.5f);
}

template <class S>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr double o = 2e-5, lse = 2e-5;
};
template <>
struct Tolerance<Eigen::bfloat16> {
  static constexpr double o = 3e-2, lse = 2e-5;  // the LSE is float
};
template <>
struct Tolerance<Eigen::half> {
  static constexpr double o = 4e-3, lse = 2e-5;
};

/// A contiguous [b, s, h, d] float copy of v, in `buffer`.
template <class E>
TensorView<const float> float_copy(TensorView<const E> v, std::vector<float>& buffer) {
  buffer.clear();
  for (index_t b = 0; b < v.shape[0]; ++b)
    for (index_t i = 0; i < v.shape[1]; ++i)
      for (index_t h = 0; h < v.shape[2]; ++h)
        for (index_t d = 0; d < v.shape[3]; ++d) buffer.push_back(tileattn::to_float(v(b, i, h, d)));
  return tileattn::make_bshd(static_cast<const float*>(buffer.data()), v.shape[0], v.shape[1], v.shape[2],
                             v.shape[3]);
}

/// Max |O - reference| and |LSE - reference| within the type's tolerance.
template <class E>
void expect_matches_reference(TensorView<const E> q, TensorView<const E> k, TensorView<const E> v,
                              TensorView<const E> o, LseView lse, const tileattn::ForwardOptions& options,
                              double tol_o, double tol_lse) {
  // The reference reads float: copies of the (already rounded) inputs, so rounding them is
  // nobody's error.
  std::vector<float> qf, kf, vf;
  const auto ref = tileattn::reference::attention(float_copy(q, qf), float_copy(k, kf), float_copy(v, vf),
                                                  tileattn::reference::Options::from(options));
  double err_o = 0, err_lse = 0;
  for (index_t b = 0; b < o.shape[0]; ++b)
    for (index_t i = 0; i < o.shape[1]; ++i)
      for (index_t h = 0; h < o.shape[2]; ++h) {
        for (index_t d = 0; d < o.shape[3]; ++d)
          err_o = std::max(err_o, std::abs(double(tileattn::to_float(o(b, i, h, d))) - ref.out(b, i, h, d)));
        err_lse = std::max(err_lse, std::abs(double(lse(b, h, i)) - ref.log_sum_exp(b, h, i)));
      }
  EXPECT_LE(err_o, tol_o) << tileattn::type_name<E>();
  EXPECT_LE(err_lse, tol_lse) << tileattn::type_name<E>();
  std::printf("  %s: max |O - reference| = %.2e, max |LSE - reference| = %.2e\n", tileattn::type_name<E>(),
              err_o, err_lse);
}

template <class T>
bool same_bytes(const T* a, const T* b, index_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(T)) == 0;
}

// The awkward sizes: batch 2, 17 queries, 33 keys, 4 query heads on 2 K/V heads, head_dim 40.
constexpr index_t B = 2, Nq = 17, Nk = 33, Hq = 4, Hkv = 2, D = 40;

template <class S>
class EigenForward : public ::testing::Test {};
using Scalars = ::testing::Types<float, Eigen::bfloat16, Eigen::half>;
TYPED_TEST_SUITE(EigenForward, Scalars);

// Eigen::Tensor<S, 4, RowMajor> as [batch, seqlen, heads, head_dim]; const Q, K, V.
TYPED_TEST(EigenForward, BshdTensors) {
  using S = TypeParam;
  using E = Elem<S>;
  Tensor4<S> q(B, Nq, Hq, D), k(B, Nk, Hkv, D), v(B, Nk, Hkv, D), o(B, Nq, Hq, D);
  Lse3 lse(B, Hq, Nq);
  fill_normal(q.data(), q.size(), 1);
  fill_normal(k.data(), k.size(), 2);
  fill_normal(v.data(), v.size(), 3);
  o.setConstant(sentinel<S>());
  const Tensor4<S>& cq = q;
  const tileattn::ForwardOptions options;
  tileattn::forward(te::view(cq), te::view(std::as_const(k)), te::view(std::as_const(v)), te::view(o),
                    te::lse_view(lse), options);

  std::vector<E> o2(static_cast<std::size_t>(o.size()));
  std::vector<float> lse2(static_cast<std::size_t>(lse.size()));
  const auto pq = plain(tileattn::make_bshd(q.data(), B, Nq, Hq, D));
  const auto pk = plain(tileattn::make_bshd(k.data(), B, Nk, Hkv, D));
  const auto pv = plain(tileattn::make_bshd(v.data(), B, Nk, Hkv, D));
  tileattn::forward(pq, pk, pv, tileattn::make_bshd(o2.data(), B, Nq, Hq, D),
                    tileattn::make_lse(lse2.data(), B, Hq, Nq), options);
  EXPECT_TRUE(same_bytes(reinterpret_cast<const E*>(o.data()), o2.data(), o.size()));
  EXPECT_TRUE(same_bytes(lse.data(), lse2.data(), lse.size()));
  expect_matches_reference<E>(pq, pk, pv, te::view(o), te::lse_view(lse), options, Tolerance<S>::o,
                              Tolerance<S>::lse);
}

// TensorMaps over std::vector buffers: TensorMap<const Tensor> for Q, K, V; causal.
TYPED_TEST(EigenForward, TensorMapsOverVectors) {
  using S = TypeParam;
  using E = Elem<S>;
  std::vector<S> qb(B * Nq * Hq * D), kb(B * Nk * Hkv * D), vb(kb.size()), ob(qb.size(), sentinel<S>());
  std::vector<float> lseb(B * Hq * Nq);
  fill_normal(qb.data(), index_t(qb.size()), 4);
  fill_normal(kb.data(), index_t(kb.size()), 5);
  fill_normal(vb.data(), index_t(vb.size()), 6);
  const Eigen::TensorMap<const Tensor4<S>> q(qb.data(), B, Nq, Hq, D), k(kb.data(), B, Nk, Hkv, D),
      v(vb.data(), B, Nk, Hkv, D);
  Eigen::TensorMap<Tensor4<S>> o(ob.data(), B, Nq, Hq, D);
  Eigen::TensorMap<Lse3> lse(lseb.data(), B, Hq, Nq);
  tileattn::ForwardOptions options;
  options.causal = true;
  tileattn::forward(te::view(q), te::view(k), te::view(v), te::view(o), te::lse_view(lse), options);

  std::vector<E> o2(ob.size());
  std::vector<float> lse2(lseb.size());
  const auto pq = plain(tileattn::make_bshd(qb.data(), B, Nq, Hq, D));
  const auto pk = plain(tileattn::make_bshd(kb.data(), B, Nk, Hkv, D));
  const auto pv = plain(tileattn::make_bshd(vb.data(), B, Nk, Hkv, D));
  tileattn::forward(pq, pk, pv, tileattn::make_bshd(o2.data(), B, Nq, Hq, D),
                    tileattn::make_lse(lse2.data(), B, Hq, Nq), options);
  EXPECT_TRUE(same_bytes(reinterpret_cast<const E*>(ob.data()), o2.data(), index_t(o2.size())));
  EXPECT_TRUE(same_bytes(lseb.data(), lse2.data(), index_t(lse2.size())));
  expect_matches_reference<E>(pq, pk, pv, te::view(o), te::lse_view(lse), options, Tolerance<S>::o,
                              Tolerance<S>::lse);
}

// [batch, heads, seqlen, head_dim] tensors through view_bhsd; causal sliding window.
TYPED_TEST(EigenForward, BhsdTensors) {
  using S = TypeParam;
  using E = Elem<S>;
  Tensor4<S> q(B, Hq, Nq, D), k(B, Hkv, Nk, D), v(B, Hkv, Nk, D), o(B, Hq, Nq, D);
  Lse3 lse(B, Hq, Nq);
  fill_normal(q.data(), q.size(), 7);
  fill_normal(k.data(), k.size(), 8);
  fill_normal(v.data(), v.size(), 9);
  o.setConstant(sentinel<S>());
  tileattn::ForwardOptions options;
  options.causal = true;
  options.window_left = 9;
  const auto vq = te::view_bhsd(q);
  EXPECT_EQ(vq.shape, (std::array<index_t, 4>{B, Nq, Hq, D}));
  tileattn::forward(vq, te::view_bhsd(k), te::view_bhsd(v), te::view_bhsd(o), te::lse_view(lse), options);

  std::vector<E> o2(static_cast<std::size_t>(o.size()));
  std::vector<float> lse2(static_cast<std::size_t>(lse.size()));
  const auto pq = plain(tileattn::make_bhsd(q.data(), B, Hq, Nq, D));
  const auto pk = plain(tileattn::make_bhsd(k.data(), B, Hkv, Nk, D));
  const auto pv = plain(tileattn::make_bhsd(v.data(), B, Hkv, Nk, D));
  tileattn::forward(pq, pk, pv, tileattn::make_bhsd(o2.data(), B, Hq, Nq, D),
                    tileattn::make_lse(lse2.data(), B, Hq, Nq), options);
  EXPECT_TRUE(same_bytes(reinterpret_cast<const E*>(o.data()), o2.data(), o.size()));
  EXPECT_TRUE(same_bytes(lse.data(), lse2.data(), lse.size()));
  // Spot check that the dimensions are read as [b, h, s, d]: O(b=1, h=3, i=16, d=39).
  EXPECT_EQ(tileattn::to_float(te::view_bhsd(o)(1, 16, 3, 39)), float(o(1, 3, 16, 39)));
  expect_matches_reference<E>(pq, pk, pv, te::view_bhsd(o), te::lse_view(lse), options, Tolerance<S>::o,
                              Tolerance<S>::lse);
}

/// One head's plain strided view [1, rows, 1, cols].
template <class S>
auto plain_head(S* data, index_t rows, index_t cols, index_t outer, index_t inner) {
  return plain(tileattn::StridedView<S, 4>{data, {1, rows, 1, cols}, {rows * outer, outer, cols * inner, inner}});
}

// One head: Q an Eigen::Matrix; K a Map with outer stride 48 > 40; V a Map with outer
// stride 100 and inner stride 2; O a Map with outer stride 44 (its padding stays
// untouched); the LSE a VectorXf.
TYPED_TEST(EigenForward, OneHeadMatrixAndMaps) {
  using S = TypeParam;
  using E = Elem<S>;
  using Mat = RowMatrix<S>;
  using Strided = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  constexpr index_t ks = 48, vs = 100, os = 44;
  Mat q(Nq, D);
  fill_normal(q.data(), q.size(), 10);
  std::vector<S> kb(Nk * ks), vb(Nk * vs), ob(Nq * os, sentinel<S>()), ob2(ob);
  fill_normal(kb.data(), index_t(kb.size()), 11);
  fill_normal(vb.data(), index_t(vb.size()), 12);
  const Eigen::Map<const Mat, Eigen::Unaligned, Eigen::OuterStride<>> k(kb.data(), Nk, D, Eigen::OuterStride<>(ks));
  const Eigen::Map<const Mat, Eigen::Unaligned, Strided> v(vb.data(), Nk, D, Strided(vs, 2));
  Eigen::Map<Mat, Eigen::Unaligned, Eigen::OuterStride<>> o(ob.data(), Nq, D, Eigen::OuterStride<>(os));
  Eigen::VectorXf lse(Nq), lse2(Nq);
  tileattn::ForwardOptions options;
  options.softmax_scale = 0.2f;
  const auto vo = te::view(o);
  EXPECT_EQ(vo.shape, (std::array<index_t, 4>{1, Nq, 1, D}));
  EXPECT_EQ(vo.stride[1], os);
  EXPECT_EQ(te::view(v).stride[3], 2);
  tileattn::forward(te::view(std::as_const(q)), te::view(k), te::view(v), vo, te::lse_view(lse), options);

  const auto pq = plain_head(q.data(), Nq, D, D, 1);
  const auto pk = plain_head(kb.data(), Nk, D, ks, 1);
  const auto pv = plain_head(vb.data(), Nk, D, vs, 2);
  const auto po = plain_head(ob2.data(), Nq, D, os, 1);
  tileattn::forward(pq, pk, pv, po, tileattn::make_lse(lse2.data(), 1, 1, Nq), options);
  // The whole buffers, padding included: identical, and the padding still the sentinel.
  EXPECT_TRUE(same_bytes(ob.data(), ob2.data(), index_t(ob.size())));
  EXPECT_TRUE(same_bytes(lse.data(), lse2.data(), Nq));
  for (index_t i = 0; i < Nq; ++i)
    for (index_t c = D; c < os; ++c) EXPECT_EQ(float(ob[std::size_t(i * os + c)]), float(sentinel<S>()));
  expect_matches_reference<E>(pq, pk, pv, te::view(o), te::lse_view(lse), options, Tolerance<S>::o,
                              Tolerance<S>::lse);
}

// One head as Blocks of larger row-major matrices (Q, O), a Ref (K), a Matrix (V) and a
// strided Map of the LSE (inner stride 3).
TYPED_TEST(EigenForward, OneHeadBlocksAndRefs) {
  using S = TypeParam;
  using E = Elem<S>;
  using Mat = RowMatrix<S>;
  Mat qbig(Nq + 5, D + 7), kmat(Nk, D), v(Nk, D), obig(Nq + 3, D + 9), obig2(Nq + 3, D + 9);
  fill_normal(qbig.data(), qbig.size(), 13);
  fill_normal(kmat.data(), kmat.size(), 14);
  fill_normal(v.data(), v.size(), 15);
  obig.setConstant(sentinel<S>());
  obig2.setConstant(sentinel<S>());
  std::vector<float> lseb(Nq * 3, 7.0f), lse2(Nq);
  const Eigen::Ref<const Mat> k(kmat);
  auto q = qbig.block(2, 3, Nq, D);
  auto o = obig.block(1, 4, Nq, D);
  Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<3>> lse(lseb.data(), Nq);
  const tileattn::ForwardOptions options;
  tileattn::forward(te::view(q), te::view(k), te::view(v), te::view(o), te::lse_view(lse), options);

  const auto pq = plain_head(&qbig(2, 3), Nq, D, D + 7, 1);
  const auto pk = plain_head(kmat.data(), Nk, D, D, 1);
  const auto pv = plain_head(v.data(), Nk, D, D, 1);
  tileattn::forward(pq, pk, pv, plain_head(&obig2(1, 4), Nq, D, D + 9, 1),
                    tileattn::make_lse(lse2.data(), 1, 1, Nq), options);
  EXPECT_TRUE(same_bytes(obig.data(), obig2.data(), obig.size()));
  for (index_t i = 0; i < Nq; ++i) {
    EXPECT_EQ(std::memcmp(&lseb[std::size_t(3 * i)], &lse2[std::size_t(i)], sizeof(float)), 0) << i;
    EXPECT_EQ(lseb[std::size_t(3 * i + 1)], 7.0f);  // between the strided entries: untouched
  }
  expect_matches_reference<E>(pq, pk, pv, te::view(o), te::lse_view(lse), options, Tolerance<S>::o,
                              Tolerance<S>::lse);
}

// ---- Views: fields -----------------------------------------------------------------------

TEST(EigenViews, TensorShapesAndStrides) {
  Tensor4<Eigen::half> t(2, 3, 5, 7);
  const auto v = te::view(t);
  EXPECT_EQ(static_cast<const void*>(v.data), static_cast<const void*>(t.data()));
  EXPECT_EQ(v.shape, (std::array<index_t, 4>{2, 3, 5, 7}));
  EXPECT_EQ(v.stride, (std::array<index_t, 4>{105, 35, 7, 1}));
  const auto b = te::view_bhsd(t);  // [2 batch, 3 heads, 5 seqlen, 7 head_dim]
  EXPECT_EQ(b.shape, (std::array<index_t, 4>{2, 5, 3, 7}));
  EXPECT_EQ(b.stride, (std::array<index_t, 4>{105, 7, 35, 1}));
  t(1, 2, 4, 6) = Eigen::half(3.5f);
  EXPECT_EQ(tileattn::to_float(v(1, 2, 4, 6)), 3.5f);
  EXPECT_EQ(tileattn::to_float(b(1, 4, 2, 6)), 3.5f);

  Lse3 lse(2, 3, 5);
  const LseView l = te::lse_view(lse);
  EXPECT_EQ(l.data, lse.data());
  EXPECT_EQ(l.shape, (std::array<index_t, 3>{2, 3, 5}));
  EXPECT_EQ(l.stride, (std::array<index_t, 3>{15, 5, 1}));
}

TEST(EigenViews, MatrixShapesAndStrides) {
  std::vector<float> buf(200);
  Eigen::Map<RowMatrix<float>, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>> m(
      buf.data(), 6, 9, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(30, 3));
  const auto v = te::view(m);
  EXPECT_EQ(v.data, buf.data());
  EXPECT_EQ(v.shape, (std::array<index_t, 4>{1, 6, 1, 9}));
  EXPECT_EQ(v.stride[1], 30);
  EXPECT_EQ(v.stride[3], 3);
  m(5, 8) = 2.25f;
  EXPECT_EQ(v(0, 5, 0, 8), 2.25f);

  RowMatrix<Eigen::bfloat16> r(4, 5);
  const auto rv = te::view(r);
  EXPECT_EQ(rv.shape, (std::array<index_t, 4>{1, 4, 1, 5}));
  EXPECT_EQ(rv.stride[1], 5);
  EXPECT_EQ(rv.stride[3], 1);

  Eigen::VectorXf lse(11);
  const LseView l = te::lse_view(lse);
  EXPECT_EQ(l.data, lse.data());
  EXPECT_EQ(l.shape, (std::array<index_t, 3>{1, 1, 11}));
  EXPECT_EQ(l.stride[2], 1);
}

// The mapping reinterprets memory: Eigen's 16-bit types must hold tileattn's bits for the
// same value (both round to nearest even).
TEST(EigenViews, SameBitsAsTileattnTypes) {
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 1.3f, 3.14159f, 1e-3f, 65504.0f, 1e-6f, 1e30f, 1.00390625f}) {
    const Eigen::bfloat16 eb(x);
    const Eigen::half eh(x);
    std::uint16_t b = 0, h = 0;
    std::memcpy(&b, &eb, 2);
    std::memcpy(&h, &eh, 2);
    EXPECT_EQ(b, tileattn::bf16(x).bits) << x;
    if (std::abs(x) <= 65504.0f) {
      EXPECT_EQ(h, tileattn::fp16(x).bits) << x;
    }
    EXPECT_EQ(static_cast<float>(eb), tileattn::to_float(tileattn::bf16::from_bits(b))) << x;
    EXPECT_EQ(static_cast<float>(eh), tileattn::to_float(tileattn::fp16::from_bits(h))) << x;
  }
}

}  // namespace
