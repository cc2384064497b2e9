#include "poseidon/sfb/sufficient_factors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace poseidon {
namespace {

TEST(SufficientFactors, RebuildsTheDenseSum) {
  const int64_t m = 37, n = 53;
  const std::vector<int64_t> rows{5, 1, 8};
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<std::vector<float>> us, vs;
  std::vector<double> denseW(m * n, 0), denseB(m, 0);
  for (int64_t k : rows) {
    std::vector<float> u(k * m), v(k * n);
    for (auto& x : u) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t i = 0; i < m; ++i) {
        denseB[i] += u[r * m + i];
        for (int64_t j = 0; j < n; ++j) denseW[i * n + j] += double(u[r * m + i]) * v[r * n + j];
      }
    us.push_back(u);
    vs.push_back(v);
  }
  std::vector<FactorView> views;
  for (size_t w = 0; w < rows.size(); ++w) views.push_back({us[w].data(), vs[w].data(), rows[w]});
  std::vector<float> W(m * n), B(m);
  FactorScratch scratch;
  reconstructGradient(views, m, n, 1.0f / 3, W.data(), B.data(), &scratch);
  double maxRel = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    double ref = denseW[i] / 3;
    maxRel = std::max(maxRel, std::abs(W[i] - ref) / std::max(1.0, std::abs(ref)));
  }
  EXPECT_LT(maxRel, 1e-5);
  for (int64_t i = 0; i < m; ++i) EXPECT_NEAR(B[i], denseB[i] / 3, 1e-5);
}

}  // namespace
}  // namespace poseidon
