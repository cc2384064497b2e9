// Communication cost model (paper Table 1). BestScheme (Algorithm 1), which
// decides with these costs, is in core/best_scheme.h.
//
// Costs are floats moved per iteration by one node (sent + received), for an
// M x N fully-connected layer with P1 workers, P2 server shards and
// per-worker batch K. Non-FC layers are costed as PS over all their params.
#pragma once

#include <cstdint>

#include "poseidon/model/layer.h"

namespace poseidon {

struct CostInputs {
  int64_t m = 0;  // FC rows (out); for non-FC layers use m = numel, n = 1
  int64_t n = 0;  // FC cols (in)
  int64_t batch = 0;  // K, rows of sufficient factors per worker
  int workers = 0;    // P1
  int servers = 0;    // P2
};

// PS: worker pushes M N and pulls M N.
double psCostWorker(const CostInputs& c);
// PS: a server shard receives and sends M N / P2 to each of P1 workers.
double psCostServer(const CostInputs& c);
// PS on a node that is both worker and server: 2 M N (P1 + P2 - 2) / P2.
double psCostBoth(const CostInputs& c);
// PS on a node of the given roles: one of the three above (0 for neither).
double psCostNode(const CostInputs& c, bool worker, bool server);
// SFB: 2 K (P1 - 1)(M + N).
double sfbCost(const CostInputs& c);
// Project Adam style (factors up, full matrix down), for comparison only.
double adamCostWorker(const CostInputs& c);
double adamCostServer(const CostInputs& c);
double adamCostBoth(const CostInputs& c);

// Cost inputs of a layer: FC layers use their M x N weight; other layers are
// treated as one PS tensor of all their parameters.
CostInputs costInputs(const LayerSpec& layer, int64_t batch, int workers, int servers);

}  // namespace poseidon
