// tests/arch/dispatch_reference.hpp: the C interface of dispatch_reference.cpp, the forward
// built with -march=native into its own shared library, which dispatch_test.cpp (built
// without -march) compares its bits against.
#pragma once

extern "C" {
struct DispatchCase {
  long batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int causal;
};
enum DispatchType { dispatch_fp32 = 0, dispatch_bf16 = 1, dispatch_fp16 = 2 };

/// tileattn::active_isa() of the -march=native build.
const char* dispatch_reference_isa();
/// tileattn::forward of the -march=native build on bshd q, k, v (elements of `type`), into o
/// and lse ([batch, heads_q, seqlen_q]), one thread.
void dispatch_reference_forward(int type, const void* q, const void* k, const void* v, void* o, float* lse,
                                const DispatchCase* c);
}
