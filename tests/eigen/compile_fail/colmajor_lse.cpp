// Must not compile: the LSE tensor [batch, heads, seqlen_q] must be RowMajor too.
#include <tileattn/eigen.hpp>

int main() {
  Eigen::Tensor<float, 3> lse(1, 2, 3);
  return static_cast<int>(tileattn::eigen::lse_view(lse).shape[0]);
}
