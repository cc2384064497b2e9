// Traffic counters: bytes and messages sent and received per layer and per
// scheme, so tests and benchmarks can compare bytes on the wire with the
// paper's Table 1. Only network traffic is counted: a node's messages to
// itself (worker to its own colocated shard, its own factors) never touch the
// wire and are not counted. Bytes are header + payload.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "poseidon/wire/message_table.h"  // TrafficKind

namespace poseidon {

struct TrafficTotals {
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
  uint64_t messagesReceived = 0;
  TrafficTotals& operator+=(const TrafficTotals& o) {
    bytesSent += o.bytesSent;
    bytesReceived += o.bytesReceived;
    messagesSent += o.messagesSent;
    messagesReceived += o.messagesReceived;
    return *this;
  }
};

class TrafficCounters {
 public:
  // Layers are known only after the book arrives; traffic for a layer index
  // outside [0, layers) is counted under the last slot (control/other).
  void resize(int layers) {
    layers_ = layers;
    cells_.reset(new Cell[static_cast<size_t>(layers + 1) * kTrafficKinds]);
  }
  void addSent(int layer, TrafficKind kind, uint64_t bytes) {
    Cell& c = cell(layer, kind);
    c.bytesSent.fetch_add(bytes, std::memory_order_relaxed);
    c.messagesSent.fetch_add(1, std::memory_order_relaxed);
  }
  void addReceived(int layer, TrafficKind kind, uint64_t bytes) {
    Cell& c = cell(layer, kind);
    c.bytesReceived.fetch_add(bytes, std::memory_order_relaxed);
    c.messagesReceived.fetch_add(1, std::memory_order_relaxed);
  }
  // Gradient data (PS, SFB, Adam; not control, not local aggregation) sent to each rank: with
  // several ranks per machine, what leaves the machine is what goes to the other machines' ranks.
  void resizePeers(int ranks) {
    peers_ = ranks;
    sentTo_.reset(new std::atomic<uint64_t>[static_cast<size_t>(ranks)]());
  }
  void addDataSentTo(int dest, TrafficKind kind, uint64_t bytes) {
    if (kind == TrafficKind::kControl || kind == TrafficKind::kLocal || dest < 0 || dest >= peers_) return;
    sentTo_[static_cast<size_t>(dest)].fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t dataSentTo(int dest) const {
    return dest >= 0 && dest < peers_ ? sentTo_[static_cast<size_t>(dest)].load(std::memory_order_relaxed) : 0;
  }
  TrafficTotals layer(int layer, TrafficKind kind) const { return read(const_cast<TrafficCounters*>(this)->cell(layer, kind)); }
  TrafficTotals total(TrafficKind kind) const {
    TrafficTotals t;
    for (int l = 0; l <= layers_; ++l) t += read(const_cast<TrafficCounters*>(this)->cellAt(l, kind));
    return t;
  }
  int layers() const { return layers_; }

 private:
  struct Cell {
    std::atomic<uint64_t> bytesSent{0}, bytesReceived{0}, messagesSent{0}, messagesReceived{0};
  };
  Cell& cellAt(int slot, TrafficKind kind) { return cells_[static_cast<size_t>(slot) * kTrafficKinds + static_cast<int>(kind)]; }
  Cell& cell(int layer, TrafficKind kind) {
    int slot = (layer >= 0 && layer < layers_) ? layer : layers_;
    return cellAt(slot, kind);
  }
  static TrafficTotals read(const Cell& c) {
    TrafficTotals t;
    t.bytesSent = c.bytesSent.load(std::memory_order_relaxed);
    t.bytesReceived = c.bytesReceived.load(std::memory_order_relaxed);
    t.messagesSent = c.messagesSent.load(std::memory_order_relaxed);
    t.messagesReceived = c.messagesReceived.load(std::memory_order_relaxed);
    return t;
  }
  int layers_ = 0;
  int peers_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> sentTo_;
  std::unique_ptr<Cell[]> cells_{new Cell[kTrafficKinds]};
};

}  // namespace poseidon
