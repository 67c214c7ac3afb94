// The avx2+vnni variant's int8 GEMM (ops/linear/gemm_kernel.cpp) compiled on the software model
// of vpdpbusd (DITOPS_AVXVNNI_MODEL=1: ditops::avx2_vnni_model, AVX2 instructions only), so its
// u8 rows (x + 128), column compensation and 6-row tiles run on any AVX2 CPU, bit for bit
// against
// - the scalar variant, exact for any byte as vpdpbusd is, with an epilogue every level rounds
//   alike (no bias, no activation: one product per element), weights of -128 included;
// - the avx2 variant, whose epilogue code it shares (FMA, activations, bf16 output), on weights
//   in [-127, 127], where AVX2's sign trick is exact.
// Where the CPU has AVX-VNNI, the library's avx2+vnni kernel (vpdpbusd itself) against the model.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
  bool minus_128;  ///< weights of -128 among the extremes
};

std::string describe(const Case& c) {
  return "m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) +
         (c.dynamic ? " dynamic" : " static") + (c.y_dtype == DType::f32 ? " f32" : " bf16") +
         " activation " + std::to_string(static_cast<int>(c.activation)) + (c.bias ? " bias" : "") +
         (c.minus_128 ? " w -128" : "");
}

/// A case's operands: x mostly normal with saturating elements (u8 rows of 0 and 255 after the
/// +128), W uniform bytes with a third of them at the extremes.
struct Operands {
  std::vector<float> x;
  std::vector<std::int8_t> w;
  std::vector<std::int32_t> column_offset;
  std::vector<float> column_scale, bias;

  Operands(const Case& c, std::mt19937& rng)
      : x(static_cast<std::size_t>(c.m * c.k)),
        w(static_cast<std::size_t>(c.n * c.k)),
        column_offset(static_cast<std::size_t>(c.n)),
        column_scale(static_cast<std::size_t>(c.n)),
        bias(static_cast<std::size_t>(c.n)) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& value : x) {
      const std::uint32_t pick = rng() % 16;
      value = pick == 0 ? 1e4f : pick == 1 ? -1e4f : normal(rng);
    }
    if (c.k >= 2) x[0] = 1e4f, x[1] = -1e4f;
    const int lowest = c.minus_128 ? -128 : -127;
    for (auto& value : w) {
      const std::uint32_t pick = rng() % 9;
      value =
          static_cast<std::int8_t>(pick == 0   ? -127
                                   : pick == 1 ? 127
                                   : pick == 2 ? lowest
                                               : lowest + static_cast<int>(rng() % (128 - lowest)));
    }
    // Scales of powers of two: without a bias the epilogue's one product is then exact up to
    // the int32 sum's own rounding to float, the same on every level.
    std::uniform_int_distribution<int> exponent(-14, -8);
    std::uniform_real_distribution<float> signed_value(-2.f, 2.f);
    for (std::int64_t j = 0; j < c.n; ++j) {
      column_offset[j] = c.dynamic ? 0 : static_cast<std::int32_t>(rng() % 20001) - 10000;
      column_scale[j] = std::ldexp(1.f, exponent(rng));
      bias[j] = c.bias ? signed_value(rng) : 0.f;
    }
  }
};

/// How the layer hands a kernel its work: one call per block of whole tiles over all panels (1
/// thread), or blocks of one or two tiles with the panels in two halves (as 2 threads split it).
enum class Split { one_thread, two_threads };

/// y (bytes, rows n + 5 elements apart) of the variant `Arch` on the case: x quantized by its
/// quantize_rows, W packed for its layout, gemm_int8 called as `split` says. a_out: the first m
/// rows of its quantized x, row after row (k_padded bytes each).
template <class Arch>
std::vector<std::uint8_t> run_variant(const Case& c, const Operands& in, Split split,
                                      std::vector<std::uint8_t>* a_out = nullptr) {
  const linear::Int8Layout layout = linear::int8_layout<Arch>(c.n);
  const Packed packed(in.w, c.n, c.k, layout.tile.cols, layout.activation_offset, in.column_offset,
                      in.column_scale, in.bias);
  const std::int64_t y_stride = c.n + 5;
  GemmProblem p;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.x_dtype = DType::f32;
  p.y_dtype = c.y_dtype;
  p.x = in.x.data();
  p.rows.dims = 1;
  p.rows.shape[0] = c.m;
  p.rows.rows = c.m;
  p.rows.strides[linear::kX][0] = c.k;
  p.rows.strides[linear::kY][0] = y_stride;
  p.k_padded = packed.k_padded;
  p.activation = c.activation;
  p.columns = packed.cols;
  p.panels = packed.panel_data.get();
  p.panel_bytes = packed.panel_bytes;
  p.column_offset = packed.offset.get();
  p.column_scale = packed.scale.get();
  p.bias = c.bias ? packed.bias.get() : nullptr;
  std::vector<std::uint8_t> y(
      static_cast<std::size_t>(c.m * y_stride * static_cast<std::int64_t>(dtype_size(c.y_dtype))),
      0xA5);
  p.y = y.data();

  linear::ActivationQuant quant;
  quant.dynamic = c.dynamic;
  quant.scale = 0.02f;
  quant.offset = 3.f;
  quant.row_scale = 0.02f;
  const int tile_rows = layout.tile.rows;
  const std::int64_t padded_m = round_up(c.m, tile_rows);
  Aligned<std::uint8_t> a(padded_m * p.k_padded);
  std::vector<float> row_scale(static_cast<std::size_t>(padded_m), 0.f);
  linear::quantize_rows<Arch>(p, quant, 0, c.m, a.get(), row_scale.data());
  if (a_out) a_out->assign(a.get(), a.get() + c.m * p.k_padded);

  const std::int64_t half = (packed.panels + 1) / 2;
  std::int64_t row0 = 0;
  for (int block = 0; row0 < padded_m; ++block) {
    // Two threads: blocks of two tiles and of one in turn (short last blocks), panel halves.
    const std::int64_t rows = split == Split::one_thread ? linear::kMaxBlockTiles * tile_rows
                              : block % 2 == 0           ? 2 * tile_rows
                                                         : tile_rows;
    const std::int64_t row_end = std::min(padded_m, row0 + rows);
    const auto call = [&](std::int64_t first, std::int64_t last) {
      linear::gemm_int8<Arch>(p, a.get() + row0 * p.k_padded, row_scale.data() + row0, row0,
                              row_end, first, last);
    };
    if (split == Split::one_thread) {
      call(0, packed.panels);
    } else {
      call(0, half);
      call(half, packed.panels);
    }
    row0 = row_end;
  }
  return y;
}

void expect_same_bytes(const std::vector<std::uint8_t>& expected,
                       const std::vector<std::uint8_t>& actual, const std::string& what) {
  const auto difference = std::mismatch(expected.begin(), expected.end(), actual.begin());
  EXPECT_TRUE(difference.first == expected.end())
      << what << ": y differs from byte " << (difference.first - expected.begin());
}

bool lacks_avx2() { return core::supported_isa() < core::Isa::avx2; }

/// The model against `Reference`'s gemm_int8 on one case, with 1 and 2 threads' splits.
template <class Reference>
void expect_model_equals(const Case& c, std::mt19937& rng, const std::string& reference) {
  const Operands in(c, rng);
  for (Split split : {Split::one_thread, Split::two_threads}) {
    const std::string what = describe(c) + (split == Split::one_thread ? " 1" : " 2") +
                             " thread(s), model against " + reference;
    std::vector<std::uint8_t> a_model, a_reference;
    const auto y_model = run_variant<avx2_vnni_model>(c, in, split, &a_model);
    const auto y_reference = run_variant<Reference>(c, in, split, &a_reference);
    expect_same_bytes(y_reference, y_model, what);
    // The same integers, offset by 128 for vpdpbusd (the s8 references add nothing).
    const int flip = linear::int8_layout<Reference>(c.n).activation_offset == 128 ? 0 : 0x80;
    ASSERT_EQ(a_model.size(), a_reference.size()) << what;
    for (std::size_t i = 0; i < a_model.size(); ++i) {
      ASSERT_EQ(a_model[i], a_reference[i] ^ flip) << what << ", x byte " << i;
    }
  }
}

TEST(AvxVnniModel, LayoutIsTheVpdpbusdOne) {
  const linear::Int8Layout wide = linear::int8_layout<avx2_vnni_model>(77);
  EXPECT_EQ(wide.tile.rows, 6);
  EXPECT_EQ(wide.tile.cols, 16);
  EXPECT_EQ(wide.activation_offset, 128);
  EXPECT_TRUE(wide.exact_for_minus_128);
  EXPECT_EQ(linear::int8_layout<avx2_vnni_model>(8).tile.cols, 8);  // thin layers: one vector
}

TEST(AvxVnniModel, GemmEqualsTheScalarKernelBitForBit) {
  if (lacks_avx2()) GTEST_SKIP() << "the model runs AVX2 instructions";
  std::mt19937 rng(20261129);
  int index = 0;
  for (std::int64_t m : {1, 5, 6, 7, 13, 50}) {
    for (std::int64_t k : {3, 64, 100, 129, 321}) {
      for (std::int64_t n : {1, 5, 8, 9, 16, 17, 33, 77}) {
        ++index;
        const Case c{m,
                     k,
                     n,
                     index % 2 == 0,
                     index % 3 == 0 ? DType::bf16 : DType::f32,
                     Activation::none,
                     false,
                     true};
        expect_model_equals<xsimd::sse2>(c, rng, "scalar");
        if (HasFailure()) return;
      }
    }
  }
}

TEST(AvxVnniModel, GemmEqualsTheAvx2KernelBitForBit) {
  if (lacks_avx2()) GTEST_SKIP() << "the model runs AVX2 instructions";
  std::mt19937 rng(20261130);
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  int index = 0;
  for (std::int64_t m : {1, 6, 11, 40}) {
    for (std::int64_t k : {3, 100, 257}) {
      for (std::int64_t n : {1, 8, 16, 17, 77}) {
        ++index;
        const Case c{m,
                     k,
                     n,
                     index % 2 == 0,
                     index % 3 == 0 ? DType::bf16 : DType::f32,
                     activations[index % 3],
                     index % 4 != 0,
                     false};
        expect_model_equals<xsimd::fma3<xsimd::avx2>>(c, rng, "avx2");
        if (HasFailure()) return;
      }
    }
  }
}

TEST(AvxVnniModel, GemmEqualsAtDiTWidths) {
  // k = 3072 (a DiT's hidden size), both quantizations, both outputs.
  if (lacks_avx2()) GTEST_SKIP() << "the model runs AVX2 instructions";
  std::mt19937 rng(3072);
  for (bool dynamic : {false, true}) {
    for (DType y_dtype : {DType::f32, DType::bf16}) {
      expect_model_equals<xsimd::sse2>(
          {37, 3072, 40, dynamic, y_dtype, Activation::none, false, true}, rng, "scalar");
      expect_model_equals<xsimd::fma3<xsimd::avx2>>(
          {19, 3072, 16, dynamic, y_dtype, Activation::gelu_tanh, true, false}, rng, "avx2");
    }
  }
}

// The library's avx2+vnni kernel, vpdpbusd on ymm, against the model: the same int32 sums and
// the same epilogue code, so the same bits, any weights and epilogue.
TEST(AvxVnniModel, HardwareEqualsTheModelBitForBit) {
#if DITOPS_AVXVNNI_COMPILED
  if (!core::avx_vnni_supported()) GTEST_SKIP() << "this CPU lacks AVX-VNNI";
  std::mt19937 rng(20261131);
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  int index = 0;
  for (std::int64_t m : {1, 7, 50}) {
    for (std::int64_t k : {3, 129, 3072}) {
      for (std::int64_t n : {5, 16, 77}) {
        ++index;
        const Case c{m,
                     k,
                     n,
                     index % 2 == 0,
                     index % 3 == 0 ? DType::bf16 : DType::f32,
                     activations[index % 3],
                     index % 4 != 0,
                     true};
        expect_model_equals<avx2_vnni>(c, rng, "the AVX-VNNI kernel");
        if (HasFailure()) return;
      }
    }
  }
#else
  GTEST_SKIP() << "this build has no avx2+vnni variant (DITOPS_KERNEL_VARIANTS)";
#endif
}

}  // namespace
}  // namespace ditops::test
