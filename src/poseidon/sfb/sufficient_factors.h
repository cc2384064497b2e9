// Sufficient factors of a fully-connected layer (paper section 3.2).
//
// For y = x W^T + b over a batch of K rows, u_k = dL/dy_k (length M = out)
// and v_k = x_k (length N = in). Then grad W = sum_k u_k v_k^T = U^T V and
// grad b = sum_k u_k. A worker ships U (K x M) and V (K x N) instead of the
// M x N matrix; every peer rebuilds the summed gradient of all P1 workers
// with one GEMM over the stacked factors.
//
// GEMM: Eigen (header-only, no BLAS threading to fight LibTorch's OpenMP
// pool over two cores, and vectorised well enough for these shapes).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace poseidon {

// Upper bound on the factor rows (the batch K) of one worker accepted from the wire, by the
// workers (SFB) and by the Adam-style server alike.
constexpr int64_t kMaxFactorRows = int64_t{1} << 24;

// Factors of one worker, rows-major: U is rows x m, V is rows x n.
struct FactorView {
  const float* u = nullptr;
  const float* v = nullptr;
  int64_t rows = 0;
};

// A rebuild done elsewhere than reconstructGradient on this host: the torch layer's GEMM on the
// parameter's device for a CUDA model (torch/device_staging.h). It gets every contributing worker's
// factors (fp32; valid until it returns) and the scale, and puts the mean gradient where its caller
// reads it. Runs on a pool thread; the layer's round is done when it returns.
using FactorRebuild = std::function<void(const std::vector<FactorView>& workers, float scale)>;

// Scratch buffers reused across iterations to avoid reallocating the stack.
struct FactorScratch {
  std::vector<float> u, v;
};

// grad W (m x n, row-major) = scale * sum over workers of U_p^T V_p, with the
// factors of all workers stacked in the given order and multiplied in one GEMM;
// grad b (m) = scale * column sums of the stacked U (skipped if gradB is null).
void reconstructGradient(const std::vector<FactorView>& workers, int64_t m, int64_t n, float scale, float* gradW,
                         float* gradB, FactorScratch* scratch);

}  // namespace poseidon
