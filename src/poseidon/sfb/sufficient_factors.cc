#include "poseidon/sfb/sufficient_factors.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

namespace poseidon {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void reconstructGradient(const std::vector<FactorView>& workers, int64_t m, int64_t n, float scale, float* gradW,
                         float* gradB, FactorScratch* scratch) {
  int64_t total = 0;
  for (const auto& w : workers) total += w.rows;
  const float* u = nullptr;
  const float* v = nullptr;
  if (workers.size() == 1) {
    u = workers[0].u;
    v = workers[0].v;
  } else {
    scratch->u.resize(static_cast<size_t>(total * m));
    scratch->v.resize(static_cast<size_t>(total * n));
    int64_t row = 0;
    for (const auto& w : workers) {
      std::memcpy(scratch->u.data() + row * m, w.u, sizeof(float) * w.rows * m);
      std::memcpy(scratch->v.data() + row * n, w.v, sizeof(float) * w.rows * n);
      row += w.rows;
    }
    u = scratch->u.data();
    v = scratch->v.data();
  }
  Eigen::Map<RowMatrix> W(gradW, m, n);
  if (total == 0) {
    W.setZero();
    if (gradB) Eigen::Map<Eigen::VectorXf>(gradB, m).setZero();
    return;
  }
  Eigen::Map<const RowMatrix> U(u, total, m);
  Eigen::Map<const RowMatrix> V(v, total, n);
  W.noalias() = scale * (U.transpose() * V);
  if (gradB) {
    // Row by row, each element summed in row order: Eigen's colwise().sum() splits its reduction by the
    // buffers' alignment, which differs between ranks, so replicas would differ in the last bits.
    std::fill(gradB, gradB + m, 0.f);
    for (int64_t r = 0; r < total; ++r) {
      const float* row = u + r * m;
      for (int64_t i = 0; i < m; ++i) gradB[i] += row[i];
    }
    for (int64_t i = 0; i < m; ++i) gradB[i] *= scale;
  }
}

}  // namespace poseidon
