// Must not compile, with one error: the backward of double views (as double_forward.cpp).
#include <tileattn/tileattn.hpp>

#include <vector>

int main() {
  std::vector<double> x(16), dq(16), dk(16), dv(16);
  std::vector<float> lse(4);
  const auto view = tileattn::make_bhsd(x.data(), 1, 1, 4, 4);
  tileattn::backward(view, view, view, view, tileattn::make_lse(lse.data(), 1, 1, 4), view,
                     tileattn::make_bhsd(dq.data(), 1, 1, 4, 4), tileattn::make_bhsd(dk.data(), 1, 1, 4, 4),
                     tileattn::make_bhsd(dv.data(), 1, 1, 4, 4));
}
