// tests/arch/dispatch_reference.cpp: tileattn::forward compiled with -march=native, as a
// shared library that keeps its inline code to itself (-fvisibility=hidden,
// -fvisibility-inlines-hidden, -Bsymbolic; arch/native.hpp), so that dispatch_test, built
// without -march, can run both builds in one process and compare their bits.
#include "dispatch_reference.hpp"

#include <tileattn/tileattn.hpp>

namespace {
template <class T>
void run(const void* q, const void* k, const void* v, void* o, float* lse, const DispatchCase& c) {
  using namespace tileattn;
  std::vector<float> storage;
  const ForwardOptions opts = dispatch_options(c, storage);
  forward(make_bshd<const T>(static_cast<const T*>(q), c.batch, c.seqlen_q, c.heads_q, c.head_dim),
          make_bshd<const T>(static_cast<const T*>(k), c.batch, c.seqlen_k, c.heads_kv, c.head_dim),
          make_bshd<const T>(static_cast<const T*>(v), c.batch, c.seqlen_k, c.heads_kv, c.head_dim),
          make_bshd(static_cast<T*>(o), c.batch, c.seqlen_q, c.heads_q, c.head_dim),
          make_lse(lse, c.batch, c.heads_q, c.seqlen_q), opts);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* dispatch_reference_isa() {
  return tileattn::active_isa();
}

extern "C" __attribute__((visibility("default"))) void dispatch_reference_forward(int type, const void* q,
                                                                                   const void* k, const void* v,
                                                                                   void* o, float* lse,
                                                                                   const DispatchCase* c) {
  if (type == dispatch_fp32) run<float>(q, k, v, o, lse, *c);
  else if (type == dispatch_bf16) run<tileattn::bf16>(q, k, v, o, lse, *c);
  else run<tileattn::fp16>(q, k, v, o, lse, *c);
}
