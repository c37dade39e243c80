// Must not compile: a view of a temporary tensor would dangle.
#include <tileattn/eigen.hpp>

int main() {
  return static_cast<int>(tileattn::eigen::view(Eigen::Tensor<float, 4, Eigen::RowMajor>(1, 2, 3, 4)).shape[0]);
}
