// How poseidon tune scores a run (tuner.h): a curve's numbers, a probe's mean loss and its spread,
// and the least-squares line both that spread and the plateau rule come from.
#include <algorithm>
#include <cmath>
#include <limits>

#include "poseidon/cli/tuner.h"

namespace poseidon::cli {

double curveNumber(const nlohmann::json& p, const char* key) {
  return p.contains(key) && p[key].is_number() && std::isfinite(p[key].get<double>()) ? p[key].get<double>()
                                                                                      : std::nan("");
}

LineFit fitLine(const std::vector<std::pair<double, double>>& points) {
  LineFit f;
  if (points.empty()) return f;
  const double n = static_cast<double>(points.size());
  for (const auto& [x, y] : points) {
    f.mx += x / n;
    f.my += y / n;
  }
  std::vector<double> xs;
  for (const auto& [x, y] : points) xs.push_back(x);
  std::sort(xs.begin(), xs.end());
  if (std::unique(xs.begin(), xs.end()) - xs.begin() < 3) return f;  // a line needs 3 to spare one
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    sxx += (x - f.mx) * (x - f.mx);
    sxy += (x - f.mx) * (y - f.my);
  }
  if (!(sxx > 0)) return f;
  f.slope = sxy / sxx;
  double rss = 0;
  for (const auto& [x, y] : points) {
    const double r = y - (f.my + f.slope * (x - f.mx));
    rss += r * r;
  }
  f.slopeSe = std::sqrt(rss / (n - 2) / sxx);
  f.meanSe = std::sqrt(rss / (n - 2) / n);
  return f;
}

std::pair<double, double> scoreRun(const std::vector<std::pair<double, double>>& points) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (points.empty()) return {kInf, std::nan("")};
  for (const auto& [x, y] : points)
    if (!std::isfinite(y) || y >= 1e3) return {kInf, std::nan("")};
  // The spread: the points' scatter about their trend (a falling loss is not noise).
  const LineFit f = fitLine(points);
  return {f.my, f.meanSe};
}

}  // namespace poseidon::cli
