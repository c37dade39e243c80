// Must not compile: Q, K, V and O need rank 4.
#include <tileattn/eigen.hpp>

int main() {
  Eigen::Tensor<Eigen::bfloat16, 3, Eigen::RowMajor> q(2, 3, 4);
  return static_cast<int>(tileattn::eigen::view(q).shape[0]);
}
