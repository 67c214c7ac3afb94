// The AMX int8 GEMM (ops/linear/amx_gemm.cpp) compiled on the tile model (ops/core/amx_tiles.hpp,
// DITOPS_AMX_MODEL=1) at the baseline, so the whole tile program runs on every machine: bit for
// bit against the scalar variant's gemm_int8 (both sum exactly in int32 and both epilogues are
// the baseline's).

#define DITOPS_AMX_MODEL 1

#include "ops/linear/amx_gemm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ditops/linear.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/core/isa.hpp"
#include "ops/linear/gemm_kernel.hpp"
#include "tests/linear/int8_panels.hpp"

namespace ditops::test {
namespace {

using linear::GemmProblem;

struct Case {
  std::int64_t m, k, n;
  bool dynamic;
  DType y_dtype;
  Activation activation;
  bool bias;
  std::int64_t amx_rows = 40;  ///< rows per call of the AMX kernel (whole 8-row tiles)
};

std::string describe(const Case& c) {
  return "m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) +
         (c.dynamic ? " dynamic" : " static") + (c.y_dtype == DType::f32 ? " f32" : " bf16") +
         " activation " + std::to_string(static_cast<int>(c.activation)) + (c.bias ? " bias" : "");
}

/// Which kernels a case compares, on the same int8 data: the AMX kernel compiled on the tile
/// model against the scalar variant's gemm_int8 (on every machine), or the library's AMX kernel
/// on the instructions against the avx512+bf16+vnni variant's gemm_int8, whose panels,
/// activations and epilogue code it shares (only where this process uses AMX int8).
enum class Target { model, hardware };

void expect_amx_equals_reference(const Case& c, std::mt19937& rng, Target target = Target::model) {
  SCOPED_TRACE(describe(c) + (target == Target::model ? " (tile model)" : " (AMX hardware)"));
  const std::int64_t m = c.m, k = c.k, n = c.n;
  // x: mostly normal, with rows and elements that saturate (0 and 255 after the +128).
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(m * k));
  for (std::int64_t i = 0; i < m * k; ++i) {
    const std::uint32_t pick = rng() % 16;
    x[i] = pick == 0 ? 1e4f : pick == 1 ? -1e4f : normal(rng);
  }
  if (k >= 2) x[0] = 1e4f, x[1] = -1e4f;  // both ends of the bytes in every case
  // W: uniform bytes, a third of them at the extremes -127, 127 and -128.
  std::vector<std::int8_t> w(static_cast<std::size_t>(n * k));
  for (auto& value : w) {
    const std::uint32_t pick = rng() % 9;
    value = static_cast<std::int8_t>(pick == 0   ? -127
                                     : pick == 1 ? 127
                                     : pick == 2 ? -128
                                                 : static_cast<int>(rng() % 256) - 128);
  }
  std::uniform_real_distribution<float> positive(1e-4f, 2e-3f), signed_value(-2.f, 2.f);
  std::vector<std::int32_t> column_offset(static_cast<std::size_t>(n));
  std::vector<float> column_scale(static_cast<std::size_t>(n)), bias(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    column_offset[j] = c.dynamic ? 0 : static_cast<std::int32_t>(rng() % 20001) - 10000;
    column_scale[j] = positive(rng);
    bias[j] = c.bias ? signed_value(rng) : 0.f;
  }

  const linear::Int8Layout scalar_layout = linear::int8_layout<xsimd::sse2>(n);
  ASSERT_EQ(scalar_layout.activation_offset, 0);
  const int amx_columns = n <= 16 ? 16 : 32;  // the avx512+bf16+vnni variant's panels
  const Packed scalar(w, n, k, scalar_layout.tile.cols, 0, column_offset, column_scale, bias);
  const Packed amx(w, n, k, amx_columns, 128, column_offset, column_scale, bias);

  // y rows 5 elements apart past n: the kernels address rows by the problem's row layout.
  const std::int64_t y_stride = n + 5;
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_dtype = DType::f32;
  p.y_dtype = c.y_dtype;
  p.x = x.data();
  p.rows.dims = 1;
  p.rows.shape[0] = m;
  p.rows.rows = m;
  p.rows.strides[linear::kX][0] = k;
  p.rows.strides[linear::kY][0] = y_stride;
  p.k_padded = scalar.k_padded;
  p.activation = c.activation;

  // x quantized once (the scalar variant's s8); the AMX kernel reads it as u8 = s8 + 128.
  linear::ActivationQuant quant;
  quant.dynamic = c.dynamic;
  quant.scale = 0.02f;
  quant.offset = 3.f;
  quant.row_scale = 0.02f;
  const std::int64_t padded_m = round_up(m, 8);  // whole tiles of both kernels
  Aligned<std::uint8_t> a_s8(padded_m * p.k_padded), a_u8(padded_m * p.k_padded);
  std::vector<float> row_scale(static_cast<std::size_t>(padded_m), 0.f);
  linear::quantize_rows<xsimd::sse2>(p, quant, 0, m, a_s8.get(), row_scale.data());
  for (std::int64_t i = 0; i < m * p.k_padded; ++i) a_u8[i] = a_s8[i] ^ 0x80;
  if (k >= 2) {  // static: 0 and 255; dynamic (symmetric, -127 to 127): 1 and 255
    EXPECT_EQ(a_u8[0], 255);
    EXPECT_EQ(a_u8[1], c.dynamic ? 1 : 0);
  }

  const std::int64_t y_bytes = m * y_stride * static_cast<std::int64_t>(dtype_size(c.y_dtype));
  std::vector<std::uint8_t> y_reference(static_cast<std::size_t>(y_bytes), 0xA5);
  std::vector<std::uint8_t> y_amx(static_cast<std::size_t>(y_bytes), 0xA5);

  // The problem's weights and epilogue from one packing, its output to y.
  const auto use = [&](const auto& packed, std::vector<std::uint8_t>& y) {
    p.columns = packed.cols;
    p.panels = packed.panel_data.get();
    p.panel_bytes = packed.panel_bytes;
    p.column_offset = packed.offset.get();
    p.column_scale = packed.scale.get();
    p.bias = c.bias ? packed.bias.get() : nullptr;
    p.y = y.data();
  };
  for (std::int64_t row0 = 0; row0 < padded_m; row0 += 128) {  // its most rows per call
    const std::int64_t row_end = std::min(padded_m, row0 + 128);
    if (target == Target::model) {
      use(scalar, y_reference);
      linear::gemm_int8<xsimd::sse2>(p, a_s8.get() + row0 * p.k_padded, row_scale.data() + row0,
                                     row0, row_end, 0, scalar.panels);
    } else {
#if DITOPS_AMX_COMPILED
      use(amx, y_reference);
      linear::gemm_int8<avx512_bf16>(p, a_u8.get() + row0 * p.k_padded, row_scale.data() + row0,
                                     row0, row_end, 0, amx.panels);
#endif
    }
  }

  // The AMX kernel as the layer calls it: blocks of rows that are whole 8-row tiles, by
  // default not whole 32-row blocks (short last blocks), and the panels in two chunks.
  use(amx, y_amx);
  const std::int64_t split = (amx.panels + 1) / 2;
  for (std::int64_t row0 = 0; row0 < padded_m; row0 += c.amx_rows) {
    const std::int64_t row_end = std::min(padded_m, row0 + c.amx_rows);
    for (const auto& [first, last] :
         {std::pair{std::int64_t{0}, split}, std::pair{split, amx.panels}}) {
      const std::uint8_t* a = a_u8.get() + row0 * p.k_padded;
      if (target == Target::model) {
        linear::amx_model::gemm_int8_amx<xsimd::sse2>(p, a, row_scale.data() + row0, row0, row_end,
                                                      first, last);
      } else {
#if DITOPS_AMX_COMPILED
        linear::amx::gemm_int8_amx<avx512_bf16>(p, a, row_scale.data() + row0, row0, row_end, first,
                                                last);
#endif
      }
    }
  }
  const auto first_difference =
      std::mismatch(y_reference.begin(), y_reference.end(), y_amx.begin());
  EXPECT_TRUE(first_difference.first == y_reference.end())
      << "y differs from byte " << (first_difference.first - y_reference.begin());
}

TEST(AmxGemmModel, EqualsTheScalarKernelBitForBit) {
  std::mt19937 rng(20261128);
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  int index = 0;
  for (std::int64_t m : {1, 15, 16, 17, 33, 100}) {
    for (std::int64_t k : {64, 100, 3, 129, 321}) {
      for (std::int64_t n : {1, 16, 17, 32, 33, 77}) {
        ++index;
        const Case c{m,
                     k,
                     n,
                     index % 2 == 0,
                     index % 3 == 0 ? DType::bf16 : DType::f32,
                     activations[index % 3],
                     index % 4 != 0};
        expect_amx_equals_reference(c, rng);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(AmxGemmModel, EqualsTheScalarKernelAtDiTWidths) {
  // k = 3072 (a DiT's hidden size: 48 steps of 64 bytes), both quantizations, both outputs.
  std::mt19937 rng(3072);
  for (bool dynamic : {false, true}) {
    for (DType y_dtype : {DType::f32, DType::bf16}) {
      expect_amx_equals_reference({33, 3072, 77, dynamic, y_dtype, Activation::gelu_tanh, true},
                                  rng);
      expect_amx_equals_reference({17, 3072, 16, dynamic, y_dtype, Activation::silu, false}, rng);
    }
  }
}

TEST(AmxGemmModel, EqualsTheScalarKernelInTheLayersAmxBlocks) {
  // Calls of 256 rows (linear::kMaxAmxRows, the layer's AMX tasks at k <= 4096) and a last one
  // of 48 (a block of 32, then one of 16).
  std::mt19937 rng(256);
  expect_amx_equals_reference({300, 192, 33, true, DType::bf16, Activation::none, true, 256}, rng);
  expect_amx_equals_reference({300, 64, 16, false, DType::f32, Activation::silu, true, 256}, rng);
}

// The library's kernel on the real tile instructions (tools/amx-check.sh runs it where the CPU
// has AMX): the same cases, bit for bit against the vpdpbusd kernel of the same variant.
TEST(AmxGemmHardware, EqualsTheVnniKernelBitForBit) {
  if (!core::amx_usable(core::AmxUnit::int8)) {
    GTEST_SKIP() << "AMX int8 not used here: " << core::amx_reason(core::AmxUnit::int8);
  }
  std::mt19937 rng(20261128);
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  int index = 0;
  for (std::int64_t m : {1, 17, 33, 100, 300}) {
    for (std::int64_t k : {64, 3, 321, 3072}) {
      for (std::int64_t n : {1, 16, 17, 77}) {
        ++index;
        const Case c{m,
                     k,
                     n,
                     index % 2 == 0,
                     index % 3 == 0 ? DType::bf16 : DType::f32,
                     activations[index % 3],
                     index % 4 != 0,
                     index % 5 == 0 ? 256 : 40};
        expect_amx_equals_reference(c, rng, Target::hardware);
        if (HasFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace ditops::test
