// Must not compile: tileattn stores float, bf16 and fp16 only.
#include <tileattn/eigen.hpp>

int main() {
  Eigen::Tensor<double, 4, Eigen::RowMajor> q(1, 2, 3, 4);
  return static_cast<int>(tileattn::eigen::view(q).shape[0]);
}
