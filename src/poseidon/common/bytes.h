// Bounds-checked little-endian serialization for control messages.
//
// Every read from network bytes goes through ByteReader: a short or oversized
// field throws ProtocolError instead of reading past the end, so a malformed
// message from a peer can be rejected without touching any state.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "poseidon/common/error.h"

namespace poseidon {

class ByteWriter {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u16(uint16_t v) { le(v); }
  void u32(uint32_t v) { le(v); }
  void u64(uint64_t v) { le(v); }
  void i64(int64_t v) { le(static_cast<uint64_t>(v)); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    le(bits);
  }
  void f32(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    le(bits);
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  template <typename T>
  void le(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> buf_;
};

class ByteReader {
 public:
  ByteReader(const void* data, size_t size) : p_(static_cast<const uint8_t*>(data)), size_(size) {}

  uint8_t u8() { return static_cast<uint8_t>(le<uint8_t>()); }
  uint16_t u16() { return le<uint16_t>(); }
  uint32_t u32() { return le<uint32_t>(); }
  uint64_t u64() { return le<uint64_t>(); }
  int64_t i64() { return static_cast<int64_t>(le<uint64_t>()); }
  float f32() {
    uint32_t bits = le<uint32_t>();
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  double f64() {
    uint64_t bits = le<uint64_t>();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  // Strings longer than maxLen are a protocol error (no huge allocations
  // driven by a length field from the wire).
  std::string str(size_t maxLen = 1 << 16) {
    uint32_t n = u32();
    if (n > maxLen) throw ProtocolError(strCat("string field of ", n, " bytes exceeds limit ", maxLen));
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  // A count field that bounds a following loop; rejects counts that cannot fit
  // in the remaining bytes given the minimum size of one element.
  uint32_t count(size_t minElementBytes, uint32_t maxCount) {
    uint32_t n = u32();
    if (n > maxCount || (minElementBytes > 0 && n > remaining() / minElementBytes)) {
      throw ProtocolError(strCat("count field ", n, " is out of range"));
    }
    return n;
  }
  size_t remaining() const { return size_ - pos_; }
  void expectEnd() const {
    if (pos_ != size_) throw ProtocolError(strCat(size_ - pos_, " trailing bytes in message"));
  }

 private:
  void need(size_t n) const {
    if (n > size_ - pos_) {
      throw ProtocolError(strCat("message truncated: need ", n, " bytes at offset ", pos_, ", have ",
                                 size_ - pos_));
    }
  }
  template <typename T>
  T le() {
    need(sizeof(T));
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p_[pos_ + i]) << (8 * i));
    pos_ += sizeof(T);
    return v;
  }
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace poseidon
