// A synthetic synchronization scenario shared by the in-process node tests
// and the multi-process test node: a model with awkward layer sizes, and
// deterministic per-(worker, layer, iteration) gradients or factors, so any
// node can compute every worker's contribution and check the synchronized
// result against a reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "poseidon/client/node.h"
#include "poseidon/model/layer.h"
#include "poseidon/wire/precision.h"

namespace poseidon::testing {

// Pairs of 16384 floats (64 KiB).
constexpr int64_t kScenarioPairBytes = 16384 * 4;
constexpr int64_t kScenarioBatch = 6;

inline ModelDesc scenarioModel() {
  ModelDesc m;
  m.name = "scenario";
  m.layers.push_back(LayerSpec::other("tiny", {{"scale", {1}}}));  // a 1-element tensor
  m.layers.push_back(LayerSpec::conv("conv", 5, 3, 3, 3));          // 140 floats
  m.layers.push_back(LayerSpec::fc("odd", 7, 13));                  // 104 floats: PS under auto
  m.layers.push_back(LayerSpec::fc("even", 256, 255));              // 65536 floats: exactly 4 pairs
  m.layers.push_back(LayerSpec::fc("huge", 301, 211));              // 63812 floats: 3 pairs + 14660
  return m;
}

inline uint64_t seedFor(int worker, int layer, int64_t iteration, int salt) {
  return (static_cast<uint64_t>(worker) * 1000003ull) ^ (static_cast<uint64_t>(layer) * 7919ull) ^
         (static_cast<uint64_t>(iteration) * 104729ull) ^ (static_cast<uint64_t>(salt) << 40);
}

inline std::vector<float> randomVector(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  // Uniform in [-1, 1) from the top 24 bits: portable across standard libraries.
  for (auto& x : v) x = static_cast<float>(static_cast<int64_t>(rng() >> 40) - (1 << 23)) / float(1 << 23);
  return v;
}

inline std::vector<float> denseGradient(int worker, int layer, int64_t iteration, int64_t numel) {
  return randomVector(seedFor(worker, layer, iteration, 1), numel);
}
inline std::vector<float> factorU(int worker, int layer, int64_t iteration, int64_t rows, int64_t m) {
  return randomVector(seedFor(worker, layer, iteration, 2), rows * m);
}
inline std::vector<float> factorV(int worker, int layer, int64_t iteration, int64_t rows, int64_t n) {
  return randomVector(seedFor(worker, layer, iteration, 3), rows * n);
}

// What a value looks like after a trip over the job's wire (wire/precision.h): rounded to 16 bits
// and widened again, or unchanged with fp32.
inline std::vector<float> overWire(std::vector<float> v, WirePrecision wire) {
  if (wire == WirePrecision::kFp32) return v;
  std::vector<uint8_t> narrow(v.size() * wireElementBytes(wire));
  encodeFloats(v.data(), static_cast<int64_t>(v.size()), wire, narrow.data());
  decodeFloats(narrow.data(), static_cast<int64_t>(v.size()), wire, v.data());
  return v;
}

struct LayerCheck {
  Scheme scheme = Scheme::kPS;
  // PS: equal to the float sum in worker order / P1 (with a 16-bit wire: each gradient rounded,
  // the fp32 sum rounded once, then divided)
  bool bitExact = true;
  // max |x - ref| / max |ref| against the double-precision reference (computed from the values as
  // they travel: with a 16-bit wire, each worker's rounded gradient or factors)
  double maxRelError = 0;
};

// The reference for one layer and iteration, computed in double from what each worker put on the wire.
inline std::vector<double> referenceMean(const LayerSpec& l, Scheme scheme, int workers, int64_t iteration,
                                         int layerIndex, int64_t rows, WirePrecision wire = WirePrecision::kFp32) {
  std::vector<double> ref(static_cast<size_t>(l.numel()), 0.0);
  for (int w = 0; w < workers; ++w) {
    if (scheme == Scheme::kPS) {
      auto g = overWire(denseGradient(w, layerIndex, iteration, l.numel()), wire);
      for (size_t i = 0; i < g.size(); ++i) ref[i] += g[i];
    } else {
      auto u = overWire(factorU(w, layerIndex, iteration, rows, l.m), wire);
      auto v = overWire(factorV(w, layerIndex, iteration, rows, l.n), wire);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < l.m; ++i) {
          double ui = u[r * l.m + i];
          for (int64_t j = 0; j < l.n; ++j) ref[i * l.n + j] += ui * v[r * l.n + j];
          if (l.params.size() > 1) ref[l.m * l.n + i] += ui;
        }
    }
  }
  for (auto& x : ref) x /= workers;
  return ref;
}

// Runs `iterations` iterations on a worker node, submitting layers in
// backward order, and checks every result. Returns per-layer checks of the
// last iteration (max error over all iterations).
// byLayer: instead of the barrier, wait layer by layer in forward order (Node::waitLayer, as an
// overlapped forward pass does) and check each layer as it was the moment its wait returned.
inline std::vector<LayerCheck> runScenario(Node& node, int64_t iterations, int layerPauseMs = 0, bool byLayer = false) {
  const InformationBook& book = node.book();
  const ModelDesc& model = book.model();
  const int workers = book.numWorkers();
  const int me = book.workerIndex(node.rank());
  const WirePrecision wire = book.settings().wire;
  std::vector<LayerCheck> checks(model.layers.size());
  for (int64_t t = book.settings().startIteration; t < book.settings().startIteration + iterations; ++t) {
    node.beginIteration(t);
    std::vector<std::vector<float>> grads(model.layers.size()), us(model.layers.size()), vs(model.layers.size());
    std::vector<Scheme> schemes(model.layers.size());
    for (int l = static_cast<int>(model.layers.size()) - 1; l >= 0; --l) {
      const LayerSpec& spec = model.layers[l];
      // An emulated backward: the fault tests stop processes in the middle of it.
      if (layerPauseMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(layerPauseMs));
      schemes[l] = node.schemeFor(l);
      grads[l].assign(static_cast<size_t>(spec.numel()), 0.f);
      if (schemes[l] != Scheme::kPS) {  // SFB, or Adam when forced
        us[l] = factorU(me, l, t, kScenarioBatch, spec.m);
        vs[l] = factorV(me, l, t, kScenarioBatch, spec.n);
        node.submitFactors(l, us[l].data(), vs[l].data(), kScenarioBatch,
                           LayerBuffer::contiguous(grads[l].data(), spec.numel()));
      } else {
        grads[l] = denseGradient(me, l, t, spec.numel());
        // Split weight and bias into two segments, as a framework holds them.
        int64_t first = spec.params.front().numel();
        std::vector<FloatSpan> segs{{grads[l].data(), first}};
        if (spec.numel() > first) segs.push_back({grads[l].data() + first, spec.numel() - first});
        node.submitDense(l, LayerBuffer(segs));
      }
    }
    if (byLayer) {
      std::vector<std::vector<float>> seen(model.layers.size());
      for (size_t l = 0; l < model.layers.size(); ++l) {
        node.waitLayer(static_cast<int>(l));
        seen[l] = grads[l];
      }
      node.waitIteration();  // returns at once: every layer is in
      grads = std::move(seen);
    } else {
      node.waitIteration();
    }
    for (size_t l = 0; l < model.layers.size(); ++l) {
      const LayerSpec& spec = model.layers[l];
      LayerCheck& c = checks[l];
      c.scheme = schemes[l];
      auto ref = referenceMean(spec, schemes[l], workers, t, static_cast<int>(l), kScenarioBatch, wire);
      if (schemes[l] == Scheme::kPS) {
        std::vector<float> sum = overWire(denseGradient(0, static_cast<int>(l), t, spec.numel()), wire);
        for (int w = 1; w < workers; ++w) {
          auto g = overWire(denseGradient(w, static_cast<int>(l), t, spec.numel()), wire);
          for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
        }
        sum = overWire(std::move(sum), wire);  // the shard's fp32 sum, rounded once for the way back
        for (size_t i = 0; i < sum.size(); ++i)
          if (sum[i] / static_cast<float>(workers) != grads[l][i]) c.bitExact = false;
      } else {
        c.bitExact = false;
      }
      // Error relative to the tensor's scale: max |x - ref| / max |ref|.
      double maxErr = 0, maxRef = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        maxErr = std::max(maxErr, std::abs(grads[l][i] - ref[i]));
        maxRef = std::max(maxRef, std::abs(ref[i]));
      }
      c.maxRelError = std::max(c.maxRelError, maxRef > 0 ? maxErr / maxRef : maxErr);
    }
  }
  return checks;
}

// Straggler scenario: every worker computes for `pauseMs` per layer before
// submitting it, the worker at index `slowWorker` five times longer. A worker
// whose next iteration already completed without it skips computing it.
// Every result is checked against the contributors the round reports:
// PS bit-exact (the float sum in worker order over the contributors, divided
// by their number; with a 16-bit wire of the rounded gradients, the sum
// rounded once), SFB within the returned error.
struct StragglerReport {
  std::vector<double> iterationSeconds;
  bool psExact = true;
  double sfbMaxRelError = 0;
  int excludedRounds = 0;  // layer rounds whose result left some worker out
  int64_t dropped = 0, skipped = 0;
};

inline StragglerReport runStragglerScenario(Node& node, int64_t iterations, int pauseMs, int slowWorker) {
  const InformationBook& book = node.book();
  const ModelDesc& model = book.model();
  const int me = book.workerIndex(node.rank());
  const int L = static_cast<int>(model.layers.size());
  const WirePrecision wire = book.settings().wire;
  StragglerReport rep;
  for (int64_t t = 0; t < iterations; ++t) {
    auto t0 = std::chrono::steady_clock::now();
    node.beginIteration(t);
    std::vector<std::vector<float>> out(L), us(L), vs(L);
    std::vector<Scheme> schemes(L);
    for (int l = 0; l < L; ++l) {
      out[l].assign(static_cast<size_t>(model.layers[l].numel()), 0.f);
      schemes[l] = node.schemeFor(l);
    }
    if (node.alreadyComplete()) {
      std::vector<LayerBuffer> bufs;
      for (int l = 0; l < L; ++l) bufs.push_back(LayerBuffer::contiguous(out[l].data(), static_cast<int64_t>(out[l].size())));
      node.skipIteration(bufs);
    } else {
      for (int l = L - 1; l >= 0; --l) {
        std::this_thread::sleep_for(std::chrono::milliseconds(me == slowWorker ? 5 * pauseMs : pauseMs));
        const LayerSpec& spec = model.layers[l];
        if (schemes[l] != Scheme::kPS) {
          us[l] = factorU(me, l, t, kScenarioBatch, spec.m);
          vs[l] = factorV(me, l, t, kScenarioBatch, spec.n);
          node.submitFactors(l, us[l].data(), vs[l].data(), kScenarioBatch,
                             LayerBuffer::contiguous(out[l].data(), spec.numel()));
        } else {
          out[l] = denseGradient(me, l, t, spec.numel());
          node.submitDense(l, LayerBuffer::contiguous(out[l].data(), spec.numel()));
        }
      }
    }
    node.waitIteration();
    rep.iterationSeconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (int l = 0; l < L; ++l) {
      const LayerSpec& spec = model.layers[l];
      auto who = node.contributors(l, t);
      if (who.empty()) {
        rep.psExact = false;
        continue;
      }
      if (schemes[l] == Scheme::kPS) {
        const auto& pairs = book.layout().pairsOf(l);
        for (size_t p = 0; p < pairs.size(); ++p) {
          const auto& c = who[p];
          std::vector<float> sum;
          int count = 0;
          for (int w = 0; w < static_cast<int>(c.size()); ++w) {
            if (!c[w]) continue;
            auto g = overWire(denseGradient(w, l, t, spec.numel()), wire);
            if (sum.empty()) sum.assign(g.begin() + pairs[p].offset, g.begin() + pairs[p].offset + pairs[p].length);
            else for (int64_t i = 0; i < pairs[p].length; ++i) sum[i] += g[pairs[p].offset + i];
            ++count;
          }
          if (count < static_cast<int>(c.size())) ++rep.excludedRounds;
          sum = overWire(std::move(sum), wire);  // the shard's fp32 sum, rounded once for the way back
          for (int64_t i = 0; i < pairs[p].length; ++i)
            if (sum[i] / static_cast<float>(count) != out[l][pairs[p].offset + i]) rep.psExact = false;
        }
      } else {
        const auto& c = who[0];
        std::vector<double> ref(out[l].size(), 0.0);
        int count = 0;
        for (int w = 0; w < static_cast<int>(c.size()); ++w) {
          if (!c[w]) continue;
          ++count;
          auto u = overWire(factorU(w, l, t, kScenarioBatch, spec.m), wire);
          auto v = overWire(factorV(w, l, t, kScenarioBatch, spec.n), wire);
          for (int64_t r = 0; r < kScenarioBatch; ++r)
            for (int64_t i = 0; i < spec.m; ++i) {
              for (int64_t j = 0; j < spec.n; ++j) ref[i * spec.n + j] += double(u[r * spec.m + i]) * v[r * spec.n + j];
              if (spec.params.size() > 1) ref[spec.m * spec.n + i] += u[r * spec.m + i];
            }
        }
        if (count < static_cast<int>(c.size())) ++rep.excludedRounds;
        double maxErr = 0, maxRef = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          ref[i] /= count;
          maxErr = std::max(maxErr, std::abs(out[l][i] - ref[i]));
          maxRef = std::max(maxRef, std::abs(ref[i]));
        }
        rep.sfbMaxRelError = std::max(rep.sfbMaxRelError, maxRef > 0 ? maxErr / maxRef : maxErr);
      }
    }
  }
  rep.dropped = node.droppedContributions();
  rep.skipped = node.skippedIterations();
  return rep;
}

}  // namespace poseidon::testing
