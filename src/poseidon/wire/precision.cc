#include "poseidon/wire/precision.h"

#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

const char* wirePrecisionName(WirePrecision p) {
  switch (p) {
    case WirePrecision::kFp32: return "fp32";
    case WirePrecision::kBf16: return "bf16";
    case WirePrecision::kFp16: return "fp16";
  }
  return "?";
}

WirePrecision parseWirePrecision(const std::string& text) {
  if (text == "fp32") return WirePrecision::kFp32;
  if (text == "bf16") return WirePrecision::kBf16;
  if (text == "fp16") return WirePrecision::kFp16;
  throw InvalidArgument("unknown wire precision '" + text + "' (expected fp32, bf16 or fp16)");
}

namespace {
uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
float floatOf(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
}  // namespace

uint16_t floatToBf16(float x) {
  const uint32_t b = bitsOf(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even on the 16 bits dropped; a carry rolls into the exponent (max -> inf).
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float bf16ToFloat(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }

uint16_t floatToFp16(float x) {
  const uint32_t b = bitsOf(x);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  // 65520 is halfway between 65504 (the largest half) and 65536; its tie goes to the even
  // neighbour, infinity, as does everything above (and fp32's infinity itself).
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Below half's smallest normal (2^-14): a subnormal q x 2^-24. x = mant x 2^(e - 150) with the
    // implicit bit in mant, so q = mant >> (126 - e), rounded to even by hand (not by the thread's
    // rounding mode); a carry to 1024 is the smallest normal, which is right.
    const uint32_t e = a >> 23;
    const uint32_t shift = 126 - e;      // >= 14
    if (e == 0 || shift > 24) return sign;  // below 2^-25: rounds to zero
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  uint32_t h = (a >> 13) - (112u << 10);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man x 2^-24, exact in fp32
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return floatOf(bitsOf(v) | sign);
  }
  if (exp == 31) return floatOf(sign | 0x7f800000u | (man << 13));
  return floatOf(sign | ((exp + 112u) << 23) | (man << 13));
}

namespace {
// The 16-bit formats' loops, one per direction: `convert` is the scalar conversion.
template <typename Narrow>
void narrowEach(const float* src, int64_t n, uint8_t* dst, Narrow convert) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = convert(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

template <typename Widen>
void widenEach(const uint8_t* src, int64_t n, float* dst, Widen convert) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = convert(h);
  }
}
}  // namespace

void encodeFloats(const float* src, int64_t n, WirePrecision p, uint8_t* dst) {
  switch (p) {
    case WirePrecision::kFp32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case WirePrecision::kBf16: narrowEach(src, n, dst, floatToBf16); return;
    case WirePrecision::kFp16: narrowEach(src, n, dst, floatToFp16); return;
  }
}

void decodeFloats(const uint8_t* src, int64_t n, WirePrecision p, float* dst) {
  switch (p) {
    case WirePrecision::kFp32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case WirePrecision::kBf16: widenEach(src, n, dst, bf16ToFloat); return;
    case WirePrecision::kFp16: widenEach(src, n, dst, fp16ToFloat); return;
  }
}

}  // namespace poseidon
