// The wire's number format (issue 14, `--wire`): what a gradient's floats
// travel as. fp32 is exact and the default. bf16 and fp16 halve every PS pair
// and every sufficient factor on the wire; they are lossy, like PyTorch DDP's
// fp16 compression hook, and opt-in.
//
// Where the precision is lost, and where it is not:
//   - a worker rounds its gradient pair (PS) or its factors U, V (SFB) once,
//     to the nearest 16-bit value (ties to even);
//   - a shard widens every push to fp32 and sums in fp32, in worker order
//     (kvstore/kv_shard.h), then rounds the sum once for the way back;
//   - a worker widens the sum and divides in fp32; SFB widens the factors and
//     rebuilds the gradient in fp32. Every worker rebuilds from the same
//     rounded factors (its own come back through the loopback), so every
//     replica still gets the same gradient, bit for bit.
// bf16 keeps fp32's exponent range (8 bits) with 8 significant bits; fp16 has
// 11 significant bits but overflows above 65504 and loses gradients below
// 6e-8 (values at or below 2^-25 round to 0). bf16 is the safe choice for raw
// gradient sums; fp16 is what DDP's hook sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace poseidon {

enum class WirePrecision : uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
const char* wirePrecisionName(WirePrecision p);             // "fp32", "bf16", "fp16"
WirePrecision parseWirePrecision(const std::string& text);  // throws InvalidArgument
// Bytes one float takes on the wire: 4 or 2.
inline size_t wireElementBytes(WirePrecision p) { return p == WirePrecision::kFp32 ? 4 : 2; }

// Scalar conversions, round to nearest, ties to even; NaN stays NaN, +-inf stays +-inf.
uint16_t floatToBf16(float x);
float bf16ToFloat(uint16_t h);
uint16_t floatToFp16(float x);  // beyond 65504 -> +-inf (what rounding gives)
float fp16ToFloat(uint16_t h);

// n floats into n * wireElementBytes(p) bytes at `dst` (any alignment; the
// machine's byte order, like the fp32 wire).
void encodeFloats(const float* src, int64_t n, WirePrecision p, uint8_t* dst);
// n floats from the wire at `src` (any alignment) into `dst`.
void decodeFloats(const uint8_t* src, int64_t n, WirePrecision p, float* dst);

}  // namespace poseidon
