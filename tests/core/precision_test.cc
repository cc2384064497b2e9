// The 16-bit wire formats (wire/precision.h): exact encodings of known values, round to nearest
// with ties to even, the edges (overflow, subnormals, NaN), and every 16-bit value surviving a
// round trip through fp32.
#include "poseidon/wire/precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace {

float bitsToFloat(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

TEST(WirePrecision, NamesAndSizes) {
  EXPECT_EQ(parseWirePrecision("bf16"), WirePrecision::kBf16);
  EXPECT_EQ(parseWirePrecision("fp16"), WirePrecision::kFp16);
  EXPECT_EQ(parseWirePrecision("fp32"), WirePrecision::kFp32);
  EXPECT_STREQ(wirePrecisionName(WirePrecision::kBf16), "bf16");
  EXPECT_EQ(wireElementBytes(WirePrecision::kFp32), 4u);
  EXPECT_EQ(wireElementBytes(WirePrecision::kBf16), 2u);
  EXPECT_ERROR_CONTAINS(parseWirePrecision("fp8"), InvalidArgument,
                        "unknown wire precision 'fp8' (expected fp32, bf16 or fp16)");
}

TEST(WirePrecision, Bf16RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3F80);        // a tie: down to the even neighbour
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);    // a tie: up to the even neighbour
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just above a tie: up
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to +inf
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(bitsToFloat(0x7F800001u)))));  // a NaN that truncates to inf
  EXPECT_EQ(bf16ToFloat(0x3F81), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16ToFloat(0x0001), bitsToFloat(0x00010000u));  // subnormals as in fp32
}

TEST(WirePrecision, Fp16RoundsToNearestEvenWithItsEdges) {
  EXPECT_EQ(floatToFp16(1.0f), 0x3C00);
  EXPECT_EQ(floatToFp16(-1.5f), 0xBE00);
  EXPECT_EQ(floatToFp16(1.0f + 0x1p-11f), 0x3C00);      // tie: down to even
  EXPECT_EQ(floatToFp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie: up to even
  EXPECT_EQ(floatToFp16(65504.0f), 0x7BFF);             // the largest half
  EXPECT_EQ(floatToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(floatToFp16(65520.0f), 0x7C00);  // the tie above 65504 goes to infinity
  EXPECT_EQ(floatToFp16(-1e6f), 0xFC00);
  EXPECT_EQ(floatToFp16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(floatToFp16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(floatToFp16(0x1p-25f), 0x0000);  // a tie with zero: to even, zero
  EXPECT_EQ(floatToFp16(1.5f * 0x1p-25f), 0x0001);
  EXPECT_EQ(floatToFp16(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 subnormal steps: even
  EXPECT_EQ(floatToFp16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(floatToFp16(1e-10f), 0x0000);
  EXPECT_EQ(floatToFp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(fp16ToFloat(floatToFp16(std::nanf("")))));
  EXPECT_EQ(fp16ToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16ToFloat(0x0003), 3 * 0x1p-24f);
  EXPECT_EQ(fp16ToFloat(0x7BFF), 65504.0f);
}

// Every non-NaN 16-bit value widens to fp32 and narrows back to itself.
TEST(WirePrecision, EverySixteenBitValueSurvivesTheRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto v = static_cast<uint16_t>(h);
    if ((v & 0x7FFF) <= 0x7F80) {
      ASSERT_EQ(floatToBf16(bf16ToFloat(v)), v) << std::hex << h;
    }
    if ((v & 0x7FFF) <= 0x7C00) {
      ASSERT_EQ(floatToFp16(fp16ToFloat(v)), v) << std::hex << h;
    }
  }
}

// Rounding picks the nearest 16-bit value: no neighbour is closer.
TEST(WirePrecision, RoundingIsToTheNearestValue) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-30, 15);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(mag(rng)));
    const uint16_t b = floatToBf16(x), f = floatToFp16(x);
    for (int d : {-1, 1}) {
      EXPECT_LE(std::abs(bf16ToFloat(b) - x), std::abs(bf16ToFloat(static_cast<uint16_t>(b + d)) - x)) << x;
      if ((f & 0x7FFF) != 0 || d == 1) {
        EXPECT_LE(std::abs(fp16ToFloat(f) - x), std::abs(fp16ToFloat(static_cast<uint16_t>(f + d)) - x)) << x;
      }
    }
  }
}

TEST(WirePrecision, EncodeAndDecodeAnyAlignment) {
  const std::vector<float> v{1.0f, -2.5f, 0.1f, 65504.0f, 3e-5f};
  for (WirePrecision p : {WirePrecision::kFp32, WirePrecision::kBf16, WirePrecision::kFp16}) {
    std::vector<uint8_t> buf(1 + v.size() * wireElementBytes(p));
    encodeFloats(v.data(), 5, p, buf.data() + 1);  // odd offset: any alignment
    std::vector<float> back(5);
    decodeFloats(buf.data() + 1, 5, p, back.data());
    for (size_t i = 0; i < v.size(); ++i) {
      const float expect = p == WirePrecision::kFp32   ? v[i]
                           : p == WirePrecision::kBf16 ? bf16ToFloat(floatToBf16(v[i]))
                                                       : fp16ToFloat(floatToFp16(v[i]));
      EXPECT_EQ(back[i], expect) << wirePrecisionName(p) << " " << i;
    }
  }
  EXPECT_EQ(fp16ToFloat(floatToFp16(0.1f)), 0.0999755859375f);
  EXPECT_EQ(bf16ToFloat(floatToBf16(0.1f)), 0.10009765625f);
}

}  // namespace
}  // namespace poseidon
