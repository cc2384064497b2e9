#include "poseidon/core/cost_model.h"

#include "poseidon/common/error.h"

namespace poseidon {

namespace {
double mn(const CostInputs& c) { return static_cast<double>(c.m) * static_cast<double>(c.n); }
double mPlusN(const CostInputs& c) { return static_cast<double>(c.m + c.n); }
}  // namespace

double psCostWorker(const CostInputs& c) { return 2.0 * mn(c); }

double psCostServer(const CostInputs& c) { return 2.0 * c.workers * mn(c) / c.servers; }

double psCostBoth(const CostInputs& c) {
  return 2.0 * mn(c) * (c.workers + c.servers - 2) / c.servers;
}

double psCostNode(const CostInputs& c, bool worker, bool server) {
  if (worker && server) return psCostBoth(c);
  if (worker) return psCostWorker(c);
  return server ? psCostServer(c) : 0.0;
}

double sfbCost(const CostInputs& c) {
  return 2.0 * static_cast<double>(c.batch) * (c.workers - 1) * mPlusN(c);
}

double adamCostWorker(const CostInputs& c) { return static_cast<double>(c.batch) * mPlusN(c) + mn(c); }

double adamCostServer(const CostInputs& c) {
  return c.workers * mn(c) + static_cast<double>(c.workers) * c.batch * mPlusN(c);
}

double adamCostBoth(const CostInputs& c) {
  return static_cast<double>(c.workers - 1) * (mn(c) + static_cast<double>(c.batch) * mPlusN(c));
}

CostInputs costInputs(const LayerSpec& layer, int64_t batch, int workers, int servers) {
  if (workers < 1 || servers < 1) {
    throw InvalidArgument(strCat("cost model needs at least one worker and one server (got P1=", workers,
                                 ", P2=", servers, ")"));
  }
  if (batch < 1) throw InvalidArgument(strCat("batch must be positive, got ", batch));
  CostInputs c;
  c.batch = batch;
  c.workers = workers;
  c.servers = servers;
  if (layer.type == LayerType::kFC) {
    c.m = layer.m;
    c.n = layer.n;
  } else {
    c.m = layer.numel();
    c.n = 1;
  }
  return c;
}

}  // namespace poseidon
