// Must not compile: one head's matrix must be row-major (Eigen::MatrixXf is ColMajor).
#include <tileattn/eigen.hpp>

int main() {
  Eigen::MatrixXf q(3, 4);
  return static_cast<int>(tileattn::eigen::view(q).shape[1]);
}
