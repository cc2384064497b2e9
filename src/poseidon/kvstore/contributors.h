// Contributor masks: which workers' contributions a round's result contains.
// On the wire (straggler mode only): ceil(P1 / 8) bytes, bit w % 8 of byte
// w / 8 set when the worker with index w contributed. Appended to every PS
// aggregate, and the whole payload of an SFB decision.
#pragma once

#include <cstdint>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon {

inline size_t maskBytes(int workers) { return static_cast<size_t>((workers + 7) / 8); }

inline std::vector<uint8_t> encodeMask(const std::vector<bool>& bits) {
  std::vector<uint8_t> out(maskBytes(static_cast<int>(bits.size())), 0);
  for (size_t w = 0; w < bits.size(); ++w)
    if (bits[w]) out[w / 8] |= static_cast<uint8_t>(1u << (w % 8));
  return out;
}

// Throws ProtocolError for a wrong length, bits beyond P1, or an empty set.
inline std::vector<bool> decodeMask(const uint8_t* data, size_t size, int workers) {
  if (size != maskBytes(workers)) throw ProtocolError(strCat("contributor mask of ", size, " bytes for ", workers, " workers"));
  std::vector<bool> bits(static_cast<size_t>(workers), false);
  int count = 0;
  for (size_t b = 0; b < size; ++b) {
    for (int k = 0; k < 8; ++k) {
      if (!(data[b] >> k & 1)) continue;
      size_t w = b * 8 + static_cast<size_t>(k);
      if (w >= bits.size()) throw ProtocolError("contributor mask names a worker beyond P1");
      bits[w] = true;
      ++count;
    }
  }
  if (count == 0) throw ProtocolError("empty contributor mask");
  return bits;
}

inline int countMask(const std::vector<bool>& bits) {
  int n = 0;
  for (bool b : bits) n += b;
  return n;
}

}  // namespace poseidon
