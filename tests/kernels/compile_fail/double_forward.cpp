// Must not compile, with one error: tileattn stores float, bf16 and fp16, not double (the
// static_assert is the only error: the entry point does not instantiate the kernels).
#include <tileattn/tileattn.hpp>

#include <vector>

int main() {
  std::vector<double> q(16), o(16);
  const auto q_view = tileattn::make_bhsd(q.data(), 1, 1, 4, 4);
  tileattn::forward(q_view, q_view, q_view, tileattn::make_bhsd(o.data(), 1, 1, 4, 4));
}
