// The control: the same flags compile the same calls on float views, so the failures beside
// it fail for their reason.
#include <tileattn/tileattn.hpp>

#include <vector>

int main() {
  std::vector<float> x(16), o(16), dq(16), dk(16), dv(16), lse(4);
  const auto view = tileattn::make_bhsd(x.data(), 1, 1, 4, 4);
  const auto lse_view = tileattn::make_lse(lse.data(), 1, 1, 4);
  tileattn::forward(view, view, view, tileattn::make_bhsd(o.data(), 1, 1, 4, 4), lse_view);
  tileattn::backward(view, view, view, view, lse_view, view, tileattn::make_bhsd(dq.data(), 1, 1, 4, 4),
                     tileattn::make_bhsd(dk.data(), 1, 1, 4, 4), tileattn::make_bhsd(dv.data(), 1, 1, 4, 4));
}
