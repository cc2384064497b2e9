// A layer's flat float buffer as the framework holds it: one or more
// segments (weight, bias, ...) that need not be contiguous with each other.
// The KV layout addresses the concatenation; this class maps a range of the
// concatenation onto the segments, so gradients are sent from, and results
// written into, the framework's own memory without staging copies.
#pragma once

#include <cstdint>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon {

struct FloatSpan {
  float* data = nullptr;
  int64_t size = 0;
};

class LayerBuffer {
 public:
  LayerBuffer() = default;
  explicit LayerBuffer(std::vector<FloatSpan> segments) : segments_(std::move(segments)) {
    for (const auto& s : segments_) total_ += s.size;
  }
  static LayerBuffer contiguous(float* data, int64_t size) { return LayerBuffer({FloatSpan{data, size}}); }

  int64_t size() const { return total_; }
  bool empty() const { return segments_.empty(); }
  const std::vector<FloatSpan>& segments() const { return segments_; }

  // Calls fn(float* ptr, int64_t count, int64_t doneSoFar) for each piece of
  // [offset, offset + length), in order.
  template <typename Fn>
  void forEach(int64_t offset, int64_t length, Fn&& fn) const {
    POSEIDON_ENFORCE(offset >= 0 && length >= 0 && offset + length <= total_, "range ", offset, "+", length,
                     " outside buffer of ", total_);
    int64_t segStart = 0;
    int64_t done = 0;
    for (const auto& s : segments_) {
      int64_t segEnd = segStart + s.size;
      int64_t lo = std::max(offset, segStart);
      int64_t hi = std::min(offset + length, segEnd);
      if (lo < hi) {
        fn(s.data + (lo - segStart), hi - lo, done);
        done += hi - lo;
      }
      segStart = segEnd;
      if (segStart >= offset + length) break;
    }
  }

  // Pointer to [offset, offset + length) if it lies within one segment.
  float* contiguousAt(int64_t offset, int64_t length) const {
    int64_t segStart = 0;
    for (const auto& s : segments_) {
      if (offset >= segStart && offset + length <= segStart + s.size) return s.data + (offset - segStart);
      segStart += s.size;
    }
    return nullptr;
  }

 private:
  std::vector<FloatSpan> segments_;
  int64_t total_ = 0;
};

}  // namespace poseidon
