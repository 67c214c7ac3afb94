// The AMX tile model (ops/core/amx_tiles.hpp, DITOPS_AMX_MODEL=1): the instructions' results on
// hand-computed cases, and the programs the hardware would fault on; then when the library uses
// each AMX unit (ops/core/cpu.cpp).

#define DITOPS_AMX_MODEL 1

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "ops/core/amx_tiles.hpp"
#include "ops/core/isa.hpp"

namespace ditops::test {
namespace {

constexpr core::AmxUnit kInt8 = core::AmxUnit::int8, kBf16 = core::AmxUnit::bf16;

// ---- the tile model --------------------------------------------------------------------------

namespace model = core::amx_model;

core::TileConfig config_of(std::initializer_list<std::array<int, 3>> tiles) {
  core::TileConfig config;
  config.palette = 1;
  for (const auto& [tile, rows, colsb] : tiles) {
    config.rows[tile] = static_cast<std::uint8_t>(rows);
    config.colsb[tile] = static_cast<std::uint16_t>(colsb);
  }
  return config;
}

TEST(AmxTileModel, Dpbusd) {
  // C (2 x 2 int32) += A (2 x 8 bytes, u8) . B (2 words x 2 columns, s8), wrapping in int32.
  DITOPS_TILE_CONFIG(config_of({{0, 2, 8}, {1, 2, 8}, {2, 2, 8}}));
  const std::uint8_t a[2][8] = {{255, 255, 255, 255, 1, 2, 3, 4}, {0, 0, 0, 0, 0, 0, 0, 0}};
  const std::int8_t b[2][8] = {{-128, -128, -128, -128, 1, 1, 1, 1}, {1, 2, 3, 4, -1, -1, -1, -1}};
  const std::int32_t c0[2][2] = {{2147483647, 5}, {-7, 0}};
  DITOPS_TILE_LOAD(0, c0, 8);
  DITOPS_TILE_LOAD(1, a, 8);
  DITOPS_TILE_LOAD(2, b, 8);
  DITOPS_TILE_DPBUSD(0, 1, 2);
  std::int32_t c[2][2] = {};
  DITOPS_TILE_STORE(0, c, 8);
  DITOPS_TILE_RELEASE();
  // C[0][0] = 2^31 - 1 + 255 · -128 · 4 + 1 · 1 + 2 · 2 + 3 · 3 + 4 · 4
  EXPECT_EQ(c[0][0], 2147483647 - 4 * 255 * 128 + 30);
  EXPECT_EQ(c[0][1], 5 + 4 * 255 - 10);
  EXPECT_EQ(c[1][0], -7);
  EXPECT_EQ(c[1][1], 0);
  // Wraparound: 2^31 - 1 + 4 * 255 overflows to the negative end.
  DITOPS_TILE_CONFIG(config_of({{0, 1, 4}, {1, 1, 4}, {2, 1, 4}}));
  const std::int32_t top = 2147483647;
  const std::uint8_t ones[4] = {255, 255, 255, 255};
  const std::int8_t plus[4] = {1, 1, 1, 1};
  DITOPS_TILE_LOAD(0, &top, 4);
  DITOPS_TILE_LOAD(1, ones, 4);
  DITOPS_TILE_LOAD(2, plus, 4);
  DITOPS_TILE_DPBUSD(0, 1, 2);
  std::int32_t wrapped = 0;
  DITOPS_TILE_STORE(0, &wrapped, 4);
  DITOPS_TILE_RELEASE();
  EXPECT_EQ(wrapped, static_cast<std::int32_t>(2147483647u + 4u * 255u));
}

std::uint16_t bf16_bits(float value) {  // value must be a bf16 (its low 16 bits zero)
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  EXPECT_EQ(bits & 0xFFFFu, 0u) << value;
  return static_cast<std::uint16_t>(bits >> 16);
}

TEST(AmxTileModel, Dpbf16ps) {
  // C (2 x 2 fp32) += A (2 x 4 bf16) . B (2 pair-rows x 2 columns of bf16 pairs).
  DITOPS_TILE_CONFIG(config_of({{0, 2, 8}, {1, 2, 8}, {2, 2, 8}}));
  const float a_values[2][4] = {{1.f, 2.f, 0.5f, -3.f}, {256.f, 1.f, 0.f, 0.f}};
  // B[k][n] holds the pair (k-th pair of column n): column 0 = (1, 1, 2, 2), column 1 =
  // (-1, 0.25, 4, 1).
  const float b_values[2][4] = {{1.f, 1.f, -1.f, 0.25f}, {2.f, 2.f, 4.f, 1.f}};
  std::uint16_t a[2][4], b[2][4];
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) {
      a[r][i] = bf16_bits(a_values[r][i]);
      b[r][i] = bf16_bits(b_values[r][i]);
    }
  }
  const float c0[2][2] = {{10.f, -1.f}, {0.f, 1.f}};
  DITOPS_TILE_LOAD(0, c0, 8);
  DITOPS_TILE_LOAD(1, a, 8);
  DITOPS_TILE_LOAD(2, b, 8);
  DITOPS_TILE_DPBF16PS(0, 1, 2);
  float c[2][2] = {};
  DITOPS_TILE_STORE(0, c, 8);
  EXPECT_EQ(c[0][0], 10.f + 1 * 1 + 2 * 1 + 0.5f * 2 - 3 * 2);
  EXPECT_EQ(c[0][1], -1.f - 1 + 2 * 0.25f + 0.5f * 4 - 3 * 1);
  EXPECT_EQ(c[1][0], 0.f + 256 + 1);
  EXPECT_EQ(c[1][1], 1.f - 256 + 0.25f);
  // Each product is added in fp32 in the ISA's order: 2^24 + 1 + 1 rounds to 2^24 twice
  // (a pairwise sum 1 + 1 first would give 2^24 + 2).
  DITOPS_TILE_CONFIG(config_of({{0, 1, 4}, {1, 1, 4}, {2, 1, 4}}));
  const float big = 16777216.f;
  const std::uint16_t ones[2] = {bf16_bits(1.f), bf16_bits(1.f)};
  DITOPS_TILE_LOAD(0, &big, 4);
  DITOPS_TILE_LOAD(1, ones, 4);
  DITOPS_TILE_LOAD(2, ones, 4);
  DITOPS_TILE_DPBF16PS(0, 1, 2);
  float sum = 0.f;
  DITOPS_TILE_STORE(0, &sum, 4);
  EXPECT_EQ(sum, big);
  // Denormal inputs count as zero, and a denormal result is flushed to zero.
  const std::uint16_t denormal[2] = {0x0001, bf16_bits(1.f)};  // smallest bf16 denormal, 1
  const std::uint16_t tiny[2] = {bf16_bits(0.f), bf16_bits(std::ldexp(1.f, -120))};
  const std::uint16_t scale[2] = {bf16_bits(1.f), bf16_bits(std::ldexp(1.f, -10))};
  const float zero = 0.f;
  DITOPS_TILE_LOAD(0, &zero, 4);
  DITOPS_TILE_LOAD(1, denormal, 4);
  DITOPS_TILE_LOAD(2, ones, 4);
  DITOPS_TILE_DPBF16PS(0, 1, 2);
  DITOPS_TILE_STORE(0, &sum, 4);
  EXPECT_EQ(sum, 1.f);  // 0 (the denormal) + 1
  DITOPS_TILE_LOAD(0, &zero, 4);
  DITOPS_TILE_LOAD(1, tiny, 4);
  DITOPS_TILE_LOAD(2, scale, 4);
  DITOPS_TILE_DPBF16PS(0, 1, 2);
  DITOPS_TILE_STORE(0, &sum, 4);
  EXPECT_EQ(sum, 0.f);  // 2^-130 is an fp32 denormal: flushed
  DITOPS_TILE_RELEASE();
}

class AmxTileModelDeath : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(AmxTileModelDeath, RejectsIllegalPrograms) {
  alignas(64) std::uint8_t buffer[16 * 64] = {};
  EXPECT_DEATH(DITOPS_TILE_ZERO(0), "TILEZERO tmm0: used before LDTILECFG");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 64}, {4, 16, 64}, {6, 8, 64}}));
        DITOPS_TILE_DPBUSD(0, 4, 6);
      },
      "TDPBUSD tmm4: A's colsb is not 4 x B's rows");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 8, 64}, {4, 16, 64}, {6, 16, 64}}));
        DITOPS_TILE_DPBUSD(0, 4, 6);
      },
      "TDPBUSD tmm4: A's rows differ from C's");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 32}, {4, 16, 64}, {6, 16, 64}}));
        DITOPS_TILE_DPBUSD(0, 4, 6);
      },
      "TDPBUSD tmm6: B's colsb differs from C's");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 64}, {4, 16, 64}}));
        DITOPS_TILE_DPBUSD(0, 4, 4);
      },
      "TDPBUSD");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 64}, {4, 16, 32}, {6, 16, 64}}));
        DITOPS_TILE_DPBF16PS(0, 4, 6);
      },
      "TDPBF16PS tmm4: A's colsb is not 4 x B's rows");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 64}}));
        DITOPS_TILE_LOAD(1, buffer, 64);
      },
      "TILELOADD tmm1: tile not configured");
  EXPECT_DEATH(DITOPS_TILE_CONFIG(config_of({{0, 17, 64}})), "LDTILECFG tmm0: more than 16 rows");
  EXPECT_DEATH(DITOPS_TILE_CONFIG(config_of({{3, 16, 65}})),
               "LDTILECFG tmm3: more than 64 bytes per row");
  EXPECT_DEATH(
      {
        DITOPS_TILE_CONFIG(config_of({{0, 16, 64}}));
        DITOPS_TILE_RELEASE();
        DITOPS_TILE_STORE(0, buffer, 64);
      },
      "TILESTORED tmm0: used before LDTILECFG");
}

// ---- when the library uses AMX ------------------------------------------------------------------

core::AmxSupport amx_cpu() {
  core::AmxSupport support;
  support.tile = support.int8 = support.bf16 = support.osxsave = true;
  support.xcr0 = 0x607e7 | core::kXcr0TileConfig | core::kXcr0TileData;
  return support;
}

TEST(AmxDetection, DitopsIsaCapsItLikeTheLevels) {
  const int bf16 = core::kAvx512Bf16Variant;
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, nullptr, bf16, true), "");
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, "", bf16, true), "");
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, "amx", bf16, true), "");
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, "avx512", bf16, true), "DITOPS_ISA=avx512 caps it");
  EXPECT_EQ(
      core::amx_blocker(amx_cpu(), kInt8, "avx512bw", static_cast<int>(core::Isa::avx512), true),
      "DITOPS_ISA=avx512bw caps it");
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, "scalar", 0, true), "DITOPS_ISA=scalar caps it");
  // A value detect_active ignores does not cap it either.
  EXPECT_EQ(core::amx_blocker(amx_cpu(), kInt8, "avx1024", bf16, true), "");
}

TEST(AmxDetection, NamesWhatIsMissing) {
  const int bf16 = core::kAvx512Bf16Variant;
  core::AmxSupport support = amx_cpu();
  EXPECT_NE(core::amx_blocker(support, kInt8, nullptr, bf16, false).find("no AMX kernel"),
            std::string::npos);
  EXPECT_NE(core::amx_blocker(support, kInt8, nullptr, 2, true).find("avx512+bf16+vnni"),
            std::string::npos);
  support.xcr0 &= ~core::kXcr0TileData;
  EXPECT_NE(core::amx_blocker(support, kInt8, nullptr, bf16, true).find("XTILEDATA"),
            std::string::npos);
  support.osxsave = false;
  EXPECT_NE(core::amx_blocker(support, kInt8, nullptr, bf16, true).find("XCR0"), std::string::npos);
  support.int8 = false;
  EXPECT_EQ(core::amx_blocker(support, kInt8, nullptr, bf16, true), "the CPU has no AMX-INT8");
  EXPECT_NE(core::amx_blocker(support, kBf16, nullptr, bf16, true), "the CPU has no AMX-INT8");
  support.bf16 = false;
  EXPECT_EQ(core::amx_blocker(support, kBf16, nullptr, bf16, true), "the CPU has no AMX-BF16");
  support.tile = false;
  EXPECT_EQ(core::amx_blocker(support, kInt8, nullptr, bf16, true), "the CPU has no AMX-TILE");
}

TEST(AmxDetection, BothUnitsNeedTheirOwnBit) {
  const int bf16 = core::kAvx512Bf16Variant;
  core::AmxSupport only_int8 = amx_cpu(), only_bf16 = amx_cpu();
  only_int8.bf16 = false;
  only_bf16.int8 = false;
  EXPECT_EQ(core::amx_blocker(only_int8, kInt8, nullptr, bf16, true), "");
  EXPECT_EQ(core::amx_blocker(only_int8, kBf16, nullptr, bf16, true), "the CPU has no AMX-BF16");
  EXPECT_EQ(core::amx_blocker(only_bf16, kBf16, nullptr, bf16, true), "");
  EXPECT_EQ(core::amx_blocker(only_bf16, kInt8, nullptr, bf16, true), "the CPU has no AMX-INT8");
}

class AmxThisProcess : public ::testing::TestWithParam<core::AmxUnit> {};

TEST_P(AmxThisProcess, AgreesWithTheCpuAndDitopsIsa) {
  const core::AmxUnit unit = GetParam();
  const bool has_unit = unit == kInt8 ? core::amx_support().int8 : core::amx_support().bf16;
  const bool usable = core::amx_usable(unit);
  const std::string reason = core::amx_reason(unit);
  EXPECT_EQ(usable, reason.empty()) << reason;
  const char* cap = std::getenv("DITOPS_ISA");
  const std::string level = cap != nullptr ? cap : "";
  if (level == "scalar" || level == "sse4.2" || level == "avx2" || level == "avx512bw" ||
      level == "avx512") {
    // The suite's runs per level: none of them uses AMX.
    EXPECT_FALSE(usable) << "DITOPS_ISA=" << level;
    if (core::amx_support().tile && has_unit) {
      EXPECT_NE(reason.find("DITOPS_ISA=" + level), std::string::npos) << reason;
    }
  }
  if (!core::amx_support().tile) {
    EXPECT_FALSE(usable);
    EXPECT_EQ(reason.find("DITOPS_ISA"), std::string::npos) << reason;
  }
  if (usable) {
    EXPECT_EQ(core::kernel_variant(), core::kAvx512Bf16Variant);
  }
  std::printf("[ ditops ] amx %s: %s\n", unit == kInt8 ? "int8" : "bf16",
              usable ? "used" : reason.c_str());
}

INSTANTIATE_TEST_SUITE_P(Units, AmxThisProcess, ::testing::Values(kInt8, kBf16));

}  // namespace
}  // namespace ditops::test
