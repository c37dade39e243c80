// Must not compile: a ColMajor tensor (Eigen's default) is not [batch, seqlen, heads, head_dim].
#include <tileattn/eigen.hpp>

int main() {
  Eigen::Tensor<float, 4> q(1, 2, 3, 4);
  return static_cast<int>(tileattn::eigen::view(q).shape[0]);
}
