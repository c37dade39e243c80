// The control: the same flags compile correct uses, so the failures above fail for their reason.
#include <tileattn/eigen.hpp>

int main() {
  Eigen::Tensor<Eigen::half, 4, Eigen::RowMajor> q(1, 2, 3, 4);
  Eigen::Tensor<float, 3, Eigen::RowMajor> lse(1, 3, 2);
  Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> head(2, 4);
  return static_cast<int>(tileattn::eigen::view(q).shape[0] + tileattn::eigen::lse_view(lse).shape[0] +
                          tileattn::eigen::view(head).shape[0] + tileattn::eigen::view_bhsd(q).shape[0]);
}
