// QuantLinear against the reference of tests/reference/linear_ref.hpp: the int8 sums exactly
// (integer inputs whose products stay below 2^24 come out of an identity epilogue as the exact
// integers), the epilogue within a few fp32 roundings, over M, N, K around every tile edge,
// f32 and bf16 activations and outputs, strided rows, 1 and 2 threads; per-step switching of
// timestep layers; the fused QKV equal to its parts; the gelu_tanh and silu epilogues, also
// far out and at infinities; strided y equal to contiguous y; bad arguments.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/linear.hpp>
#include <ditops/runtime.hpp>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "ops/core/isa.hpp"
#include "ops/linear/amx_gemm.hpp"
#include "ops/linear/gemm_kernel.hpp"
#include "tests/reference/linear_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/scoped_threads.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

/// M, N, K around the tile edges of every level (rows 4, 6, 8, 12; columns 8, 16, 32, one
/// vector for layers of at most one; k words of 4 and rows padded to 64 bytes; int8 k chunks
/// of 1024 or 512 bytes past 1024, f32 chunks of 128-512), thin layers (N 1, 15, 16, 17, 63,
/// 64) past one block of rows (120 f32, 80-256 int8, a thin int8 layer's blocks quantized by
/// the task), f32 tasks past one chunk of panels (256 columns), plus odd sizes.
struct Shape {
  std::int64_t m, n, k;
};
const Shape kShapes[] = {{1, 1, 1},       {1, 17, 5},      {3, 8, 4},      {4, 16, 64},
                         {5, 15, 63},     {7, 31, 65},     {8, 32, 3},     {9, 33, 127},
                         {12, 48, 128},   {13, 64, 129},   {17, 65, 200},  {25, 7, 300},
                         {64, 96, 257},   {100, 40, 31},   {6, 20, 1100},  {9, 40, 2100},
                         {130, 16, 777},  {250, 17, 300},  {121, 1, 1030}, {30, 63, 500},
                         {200, 15, 1025}, {131, 300, 260}, {90, 16, 3000}, {300, 64, 3000}};

struct Int8Layer {
  std::int64_t n = 0, k = 0;
  std::vector<std::int8_t> weight;
  std::vector<float> weight_scale, deq_scale, bias, smooth, input_scale, input_offset;
  std::vector<std::int32_t> quant_bias;

  W8A8Tensors tensors() {
    W8A8Tensors t;
    t.weight = view(weight.data(), {n, k});
    if (!weight_scale.empty()) t.weight_scale = view(weight_scale.data(), {n});
    if (!deq_scale.empty()) t.deq_scale = view(deq_scale.data(), {n});
    if (!quant_bias.empty()) t.quant_bias = view(quant_bias.data(), {n});
    if (!input_scale.empty()) {
      t.input_scale = view(input_scale.data(), {static_cast<std::int64_t>(input_scale.size())});
      t.input_offset = view(input_offset.data(), {static_cast<std::int64_t>(input_offset.size())});
    }
    if (!bias.empty()) t.bias = view(bias.data(), {n});
    if (!smooth.empty()) t.smooth_scale = view(smooth.data(), {k});
    return t;
  }
};

Int8Layer random_layer(std::int64_t n, std::int64_t k, std::mt19937& rng, bool with_bias,
                       bool with_smooth) {
  Int8Layer layer;
  layer.n = n;
  layer.k = k;
  std::uniform_int_distribution<int> weight(-127, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f), bias(-2.f, 2.f), smooth(0.5f, 2.f);
  for (std::int64_t i = 0; i < n * k; ++i)
    layer.weight.push_back(static_cast<std::int8_t>(weight(rng)));
  for (std::int64_t j = 0; j < n; ++j) {
    layer.weight_scale.push_back(scale(rng));
    layer.deq_scale.push_back(scale(rng) * 0.05f);
    layer.quant_bias.push_back(std::uniform_int_distribution<int>(-5000, 5000)(rng));
    if (with_bias) layer.bias.push_back(bias(rng));
  }
  if (with_smooth) {
    for (std::int64_t i = 0; i < k; ++i) layer.smooth.push_back(smooth(rng));
  }
  return layer;
}

/// x as floats (the values the layer reads, after bf16 rounding where x is bf16).
template <class T>
std::vector<float> values_of(const TestTensor<T>& x) {
  std::vector<float> values(static_cast<std::size_t>(x.size()));
  for (std::int64_t i = 0; i < x.size(); ++i)
    values[static_cast<std::size_t>(i)] = to_float(x.at(i));
  return values;
}

/// y [m, n] within ref's bounds, its canaries intact; a NaN expected as any NaN, an infinity
/// exactly.
template <class Y>
void expect_within(const TestTensor<Y>& y, const EpilogueRef& ref, std::int64_t n,
                   const std::string& what) {
  ASSERT_EQ(y.damaged_canaries(), 0) << what;
  int reported = 0;
  for (std::int64_t i = 0; i < y.size(); ++i) {
    const double got = y.value(i), expected = ref.expected[static_cast<std::size_t>(i)];
    const double tolerance = ref.tolerance[static_cast<std::size_t>(i)];
    const bool ok = std::isnan(expected)
                        ? std::isnan(got)
                        : got == expected || std::fabs(got - expected) <= tolerance;
    if (!ok && reported++ < 5) {
      ADD_FAILURE() << what << " y[" << i / n << ", " << i % n << "] = " << got << ", expected "
                    << expected << " +- " << tolerance;
    }
  }
}

/// y against epilogue_ref (tests/reference/linear_ref.hpp).
template <class Y>
void expect_epilogue(const TestTensor<Y>& y, const std::vector<std::int64_t>& acc,
                     const std::vector<double>& row_scale, const std::vector<float>& column_scale,
                     const std::vector<double>& column_offset, const std::vector<float>& bias,
                     std::int64_t m, std::int64_t n, const std::string& what) {
  expect_within(y,
                epilogue_ref(acc, row_scale, column_scale, column_offset, bias, m, n,
                             std::is_same_v<Y, bf16>),
                n, what);
}

/// The bound of a FLOAT layer's fp32 output: sums of k products of N(0, 1) values round by
/// about sqrt(k) ulps of the terms' magnitude; 1e-5 * (sqrt(k) + |y|) bounds it with margin.
double float_layer_tolerance(std::int64_t k, double expected) {
  return 1e-5 * (std::sqrt(static_cast<double>(k)) + std::fabs(expected));
}

// ---- exact integer sums -------------------------------------------------------------------------

/// y of a static layer with scale 1, offset 0, deq_scale 1 and quant_bias 0 for integer x (each
/// element from `value`), which quantizes to itself: y is the int32 sum converted to fp32, exact
/// while |sum| < 2^24, so the sums are compared as integers with the reference's.
void expect_int8_sums_exact(const Shape& shape, Int8Layer layer, const std::function<int()>& value,
                            const std::string& what) {
  std::fill(layer.deq_scale.begin(), layer.deq_scale.end(), 1.f);
  std::fill(layer.quant_bias.begin(), layer.quant_bias.end(), 0);
  layer.input_scale = {1.f};
  layer.input_offset = {0.f};
  const QuantLinear linear = QuantLinear::w8a8(QuantAlgo::w8a8_static, layer.tensors());
  TestTensor<float> x({shape.m, shape.k}, /*row_pad=*/3);
  for (std::int64_t i = 0; i < x.size(); ++i) x.at(i) = static_cast<float>(value());
  TestTensor<float> y({shape.m, shape.n});
  linear.forward(x.view(), y.view());
  std::vector<std::int32_t> q(x.size());
  for (std::int64_t i = 0; i < x.size(); ++i)
    q[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(x.at(i));
  const auto acc = int_matmul_ref(q, layer.weight, shape.m, shape.n, shape.k);
  ASSERT_EQ(y.damaged_canaries(), 0);
  for (std::int64_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(static_cast<std::int64_t>(y.at(i)), acc[static_cast<std::size_t>(i)])
        << "m" << shape.m << " n" << shape.n << " k" << shape.k << " " << what << " at " << i;
  }
}

// Random integer x in [-128, 127] (k <= 1000 here: the sums stay below 2^24). Weights include
// -128, which pmaddubsw levels must still multiply exactly.
TEST(QuantLinear, Int8SumsAreExactIntegers) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-128, 127);
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (const Shape& shape : kShapes) {
      for (bool minus_128 : {false, true}) {
        Int8Layer layer = random_layer(shape.n, shape.k, rng, false, false);
        if (minus_128) layer.weight[layer.weight.size() / 2] = -128;
        expect_int8_sums_exact(
            shape, layer, [&] { return value(rng); },
            "threads " + std::to_string(threads) + " -128 weight " + std::to_string(minus_128));
      }
    }
  }
}

// The largest products every multiply must hold: x of -128 and 127 against weights of +-127 (and
// -128), where a pair of products, 2 x 128 x 127 = 32512, is the most the pmaddubsw levels' int16
// pair sums hold, and sums of every sign. k = 515: 2 x 515 x 128 x 128 < 2^24.
TEST(QuantLinear, Int8SumsOfTheExtremesAreExact) {
  std::mt19937 rng(17);
  std::bernoulli_distribution coin(0.5);
  for (const Shape& shape : {Shape{9, 20, 515}, Shape{5, 7, 515}, Shape{130, 64, 515}}) {
    for (int weights : {0, 1, 2}) {  // all 127, all -127, random +-127 with a -128
      Int8Layer layer = random_layer(shape.n, shape.k, rng, false, false);
      for (std::int8_t& w : layer.weight) {
        w = weights == 0 ? 127 : weights == 1 ? -127 : coin(rng) ? 127 : -127;
      }
      if (weights == 2) layer.weight[7] = -128;
      for (int x_values : {0, 1, 2}) {  // all -128, all 127, random -128 / 127
        expect_int8_sums_exact(
            shape, layer,
            [&] {
              return x_values == 0 ? -128 : x_values == 1 ? 127 : coin(rng) ? -128 : 127;
            },
            "weights " + std::to_string(weights) + " x " + std::to_string(x_values));
      }
    }
  }
}

// ---- static and dynamic layers, every dtype -----------------------------------------------------

template <class X, class Y>
void check_algo(QuantAlgo algo, bool smooth) {
  std::mt19937 rng(11);
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (const Shape& shape : kShapes) {
      Int8Layer layer = random_layer(shape.n, shape.k, rng, shape.n % 2 == 1, smooth);
      layer.input_scale = {0.02f};
      layer.input_offset = {3.f};
      const QuantLinear linear = QuantLinear::w8a8(algo, layer.tensors());
      // Rank 3, rows strided: [2, ceil(m / 2), k] would change m; use [1, m, k].
      TestTensor<X> x({1, shape.m, shape.k}, /*row_pad=*/5);
      x.fill_normal(rng);
      if (shape.m > 1) x.at(shape.k + shape.k / 2) = from_float<X>(40.f);  // an outlier
      TestTensor<Y> y({1, shape.m, shape.n});
      linear.forward(x.view(), y.view());

      RefQuant quant;
      quant.dynamic = algo == QuantAlgo::w8a8_dynamic;
      quant.scale = layer.input_scale[0];
      quant.offset = layer.input_offset[0];
      quant.smooth = smooth ? &layer.smooth : nullptr;
      std::vector<std::int32_t> q;
      std::vector<double> row_scale;
      quantize_ref(values_of(x), shape.m, shape.k, quant, q, row_scale);
      const auto acc = int_matmul_ref(q, layer.weight, shape.m, shape.n, shape.k);
      std::vector<double> column_offset(static_cast<std::size_t>(shape.n), 0.0);
      const std::string what = std::string(quant_algo_name(algo)) + " m" + std::to_string(shape.m) +
                               " n" + std::to_string(shape.n) + " k" + std::to_string(shape.k) +
                               " threads " + std::to_string(threads);
      if (algo == QuantAlgo::w8a8_static) {
        std::fill(row_scale.begin(), row_scale.end(), 1.0);
        for (std::int64_t j = 0; j < shape.n; ++j) {
          column_offset[static_cast<std::size_t>(j)] =
              layer.quant_bias[static_cast<std::size_t>(j)];
        }
        expect_epilogue(y, acc, row_scale, layer.deq_scale, column_offset, layer.bias, shape.m,
                        shape.n, what);
      } else {
        expect_epilogue(y, acc, row_scale, layer.weight_scale, column_offset, layer.bias, shape.m,
                        shape.n, what);
      }
    }
  }
}

/// A static layer (deq_scale 1, quant_bias 0: y is the exact int32 sum) at input scale `scale`
/// and offset `shift` over x, against the reference's quotients x / scale + shift rounded.
void expect_static_sums_of_quotients(float scale, float shift, TestTensor<float>& x,
                                     std::mt19937& rng) {
  const std::int64_t m = x.shape()[0], k = x.shape()[1], n = 16;
  Int8Layer layer = random_layer(n, k, rng, false, false);
  std::fill(layer.deq_scale.begin(), layer.deq_scale.end(), 1.f);
  std::fill(layer.quant_bias.begin(), layer.quant_bias.end(), 0);
  layer.input_scale = {scale};
  layer.input_offset = {shift};
  const QuantLinear linear = QuantLinear::w8a8(QuantAlgo::w8a8_static, layer.tensors());
  TestTensor<float> y({m, n});
  linear.forward(x.view(), y.view());
  RefQuant quant;
  quant.scale = scale;
  quant.offset = shift;
  std::vector<std::int32_t> q;
  std::vector<double> row_scale;
  quantize_ref(values_of(x), m, k, quant, q, row_scale);
  const auto acc = int_matmul_ref(q, layer.weight, m, n, k);
  for (std::int64_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(static_cast<std::int64_t>(y.at(i)), acc[static_cast<std::size_t>(i)])
        << "scale " << scale << " shift " << shift << " at " << i;
  }
}

/// x at, and one ulp either side of, half-integer multiples of `scale`.
TestTensor<float> near_ties(float scale, std::mt19937& rng) {
  TestTensor<float> x({9, 200});
  std::uniform_int_distribution<int> level(-135, 135), side(-1, 1);
  for (std::int64_t i = 0; i < x.size(); ++i) {
    const float tie = (static_cast<float>(level(rng)) + 0.5f) * scale;
    const int step = side(rng);
    x.at(i) = step == 0 ? tie : std::nextafter(tie, step * 1e30f);
  }
  return x;
}

// x at, and one ulp either side of, half-integer multiples of scales that are not powers of
// two: quotients within an ulp or two of a rounding tie, where x times 1 / scale and x / scale
// can round to different integers. The int32 sums must be those of the reference's quotients.
TEST(QuantLinear, StaticQuantizationRoundsAsTheQuotient) {
  std::mt19937 rng(29);
  for (const float scale : {0.1f, 0.03f, 0.7f, 3.3f, 1e-3f}) {
    for (const float shift : {0.f, -3.f, 7.f, 0.5f}) {
      TestTensor<float> x = near_ties(scale, rng);
      expect_static_sums_of_quotients(scale, shift, x, rng);
    }
  }
}

// Quotients at the ends of the float range: scales near 2^-124 and 2^97 (quotients whose
// residual x - scale * (x / scale) underflows or whose reciprocal is subnormal, where a
// division by multiplication goes wrong at ties), a fractional offset that turns tiny
// quotients into ties (0x1p-120 / 0x1.fffffep-96 + 0.5 rounds up), and infinite and
// overflowing quotients, which clamp to the int8 ends.
TEST(QuantLinear, StaticQuantizationRoundsAsTheQuotientAtTheFloatLimits) {
  std::mt19937 rng(31);
  for (const float scale : {0x1.000002p-96f, 0x1.fffffep95f, 0x1.0f82ccp-124f, 0x1p97f}) {
    for (const float shift : {0.f, -128.f, 0.5f}) {
      TestTensor<float> x = near_ties(scale, rng);
      expect_static_sums_of_quotients(scale, shift, x, rng);
    }
  }
  const struct {
    float scale, shift, x;
  } cases[] = {{0x1.0f82ccp-124f, 0.f, -0x1.db24e4p-123f},
               {0x1.fffffep-96f, 0.5f, 0x1p-120f},
               {1e-3f, 0.f, std::numeric_limits<float>::infinity()},
               {1e-3f, 3.f, -std::numeric_limits<float>::infinity()},
               {0x1p-96f, 0.f, 3e38f},
               {0x1p-96f, 0.f, -1e30f},
               {0.03f, 0.f, 0x1p-149f}};
  for (const auto& c : cases) {
    TestTensor<float> x({2, 37});
    for (std::int64_t i = 0; i < x.size(); ++i) x.at(i) = i % 2 ? c.x : -c.x;
    expect_static_sums_of_quotients(c.scale, c.shift, x, rng);
  }
}

TEST(QuantLinear, StaticF32) { check_algo<float, float>(QuantAlgo::w8a8_static, false); }
TEST(QuantLinear, StaticSmoothBf16InF32Out) {
  check_algo<bf16, float>(QuantAlgo::w8a8_static, true);
}
TEST(QuantLinear, DynamicF32) { check_algo<float, float>(QuantAlgo::w8a8_dynamic, false); }
TEST(QuantLinear, DynamicSmoothF32InBf16Out) {
  check_algo<float, bf16>(QuantAlgo::w8a8_dynamic, true);
}
TEST(QuantLinear, DynamicBf16) { check_algo<bf16, bf16>(QuantAlgo::w8a8_dynamic, false); }

// A row of zeros quantizes with scale 1 (not 0 / 127) and gives y = bias.
TEST(QuantLinear, DynamicZeroRowGivesBias) {
  std::mt19937 rng(3);
  Int8Layer layer = random_layer(20, 40, rng, true, false);
  const QuantLinear linear = QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, layer.tensors());
  TestTensor<float> x({2, 40});
  TestTensor<float> y({2, 20});
  linear.forward(x.view(), y.view());
  for (std::int64_t i = 0; i < y.size(); ++i)
    EXPECT_EQ(y.at(i), layer.bias[static_cast<std::size_t>(i % 20)]);
}

// ---- timestep layers ----------------------------------------------------------------------------

// Steps 0..1 static, 3 static, the rest dynamic; T = 4 steps of parameters, so step 5 (policy
// default) and a static request past T are dynamic. Each step against the reference of its mode.
TEST(QuantLinear, TimestepLayerSwitchesPerStep) {
  std::mt19937 rng(5);
  const std::int64_t m = 9, n = 33, k = 70;
  Int8Layer layer = random_layer(n, k, rng, true, true);
  layer.input_scale = {0.03f, 0.05f, 0.04f, 0.02f};
  layer.input_offset = {0.f, -4.f, 2.f, 7.f};
  auto timestep = std::make_shared<Timestep>(TimestepPolicy()
                                                 .set(0, 1, TimestepMode::static_params)
                                                 .set(3, TimestepMode::static_params)
                                                 .set(6, TimestepMode::static_params));
  const QuantLinear linear = QuantLinear::w8a8(QuantAlgo::w8a8_timestep, layer.tensors(), timestep);
  TestTensor<float> x({m, k});
  x.fill_normal(rng);
  std::vector<std::int64_t> column_sum(static_cast<std::size_t>(n), 0);
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t i = 0; i < k; ++i)
      column_sum[static_cast<std::size_t>(j)] += layer.weight[static_cast<std::size_t>(j * k + i)];
  }
  for (int step : {0, 1, 2, 3, 5, 6, 0}) {
    timestep->set_step(step);
    TestTensor<float> y({m, n});
    linear.forward(x.view(), y.view());
    const bool is_static = step <= 1 || step == 3;  // step 6: static by policy but past T
    RefQuant quant;
    quant.dynamic = !is_static;
    quant.smooth = &layer.smooth;
    std::vector<double> column_offset(static_cast<std::size_t>(n), 0.0);
    if (is_static) {
      quant.scale = layer.input_scale[static_cast<std::size_t>(step)];
      quant.offset = layer.input_offset[static_cast<std::size_t>(step)];
      for (std::int64_t j = 0; j < n; ++j) {
        column_offset[static_cast<std::size_t>(j)] =
            -quant.offset * static_cast<double>(column_sum[static_cast<std::size_t>(j)]);
      }
    }
    std::vector<std::int32_t> q;
    std::vector<double> row_scale;
    quantize_ref(values_of(x), m, k, quant, q, row_scale);
    const auto acc = int_matmul_ref(q, layer.weight, m, n, k);
    expect_epilogue(y, acc, row_scale, layer.weight_scale, column_offset, layer.bias, m, n,
                    "step " + std::to_string(step));
  }
}

// Two model instances, two Timestep objects: one instance's step never changes the other's
// results, also while both run from different threads.
TEST(QuantLinear, TimestepIsPerInstance) {
  std::mt19937 rng(9);
  Int8Layer layer = random_layer(24, 48, rng, false, false);
  layer.input_scale = {0.05f};
  layer.input_offset = {0.f};
  const TimestepPolicy policy = TimestepPolicy().set(0, TimestepMode::static_params);
  auto first = std::make_shared<Timestep>(policy), second = std::make_shared<Timestep>(policy);
  const QuantLinear a = QuantLinear::w8a8(QuantAlgo::w8a8_timestep, layer.tensors(), first);
  const QuantLinear b = QuantLinear::w8a8(QuantAlgo::w8a8_timestep, layer.tensors(), second);
  TestTensor<float> x({6, 48});
  x.fill_normal(rng);
  TestTensor<float> static_y({6, 24}), dynamic_y({6, 24});
  a.forward(x.view(), static_y.view());  // step 0: static
  second->set_step(4);
  b.forward(x.view(), dynamic_y.view());  // step 4: dynamic
  ASSERT_NE(static_y.snapshot(), dynamic_y.snapshot());
  std::thread other([&] {
    for (int i = 0; i < 20; ++i) {
      TestTensor<float> y({6, 24});
      b.forward(x.view(), y.view());
      EXPECT_TRUE(y.unchanged_since(dynamic_y.snapshot()));
    }
  });
  for (int i = 0; i < 20; ++i) {
    TestTensor<float> y({6, 24});
    a.forward(x.view(), y.view());
    EXPECT_TRUE(y.unchanged_since(static_y.snapshot()));
  }
  other.join();
}

// ---- float layers -------------------------------------------------------------------------------

template <class W, class X, class Y>
void check_float() {
  std::mt19937 rng(13);
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (const Shape& shape : kShapes) {
      TestTensor<W> weight({shape.n, shape.k}, 2);
      weight.fill_normal(rng);
      std::vector<float> bias;
      if (shape.k % 2) {
        for (std::int64_t j = 0; j < shape.n; ++j)
          bias.push_back(static_cast<float>(j) * 0.1f - 1.f);
      }
      const QuantLinear linear = QuantLinear::float_linear(
          weight.view(), bias.empty() ? TensorView{} : view(bias.data(), {shape.n}));
      TestTensor<X> x({shape.m, shape.k}, 1);
      x.fill_normal(rng);
      TestTensor<Y> y({shape.m, shape.n});
      linear.forward(x.view(), y.view());
      const auto expected =
          float_matmul_ref(values_of(x), values_of(weight), bias, shape.m, shape.n, shape.k);
      ASSERT_EQ(y.damaged_canaries(), 0);
      for (std::int64_t i = 0; i < y.size(); ++i) {
        const double want = expected[static_cast<std::size_t>(i)];
        double tolerance = float_layer_tolerance(shape.k, want);
        if constexpr (std::is_same_v<Y, bf16>)
          tolerance += 0x1p-8 * std::fabs(want);  // bf16 output
        ASSERT_NEAR(y.value(i), want, tolerance)
            << "m" << shape.m << " n" << shape.n << " k" << shape.k << " at " << i;
      }
    }
  }
}

TEST(QuantLinear, FloatF32) { check_float<float, float, float>(); }

// Every output of a FLOAT layer sums its k products in order, whatever the blocking (chunks of
// k, blocks of rows, chunks of panels, which the thread count changes): the same bits at 1 and
// 2 threads.
TEST(QuantLinear, FloatIsBitwiseTheSameAtAnyThreadCount) {
  std::mt19937 rng(23);
  for (const Shape& shape : {Shape{250, 300, 400}, Shape{300, 16, 700}}) {
    TestTensor<float> weight({shape.n, shape.k});
    weight.fill_normal(rng);
    const QuantLinear linear = QuantLinear::float_linear(weight.view(), {});
    TestTensor<float> x({shape.m, shape.k});
    x.fill_normal(rng);
    TestTensor<float> one({shape.m, shape.n}), two({shape.m, shape.n});
    {
      const ScopedThreads thread_count(1);
      linear.forward(x.view(), one.view());
    }
    {
      const ScopedThreads thread_count(2);
      linear.forward(x.view(), two.view());
    }
    EXPECT_TRUE(two.unchanged_since(one.snapshot())) << "m" << shape.m << " n" << shape.n;
  }
}
TEST(QuantLinear, FloatBf16WeightsBf16Activations) { check_float<bf16, bf16, bf16>(); }

// ---- bf16 layers --------------------------------------------------------------------------------

// A FLOAT layer of bf16 weights called with bf16 x: Σ_k x · W of the exact bf16 products (a
// product of two bf16 is exact in fp32) summed in fp32, on vdpbf16ps (AVX512-BF16), TDPBF16PS
// (AMX) or the fp32 FMA (every other level), in any order of the sum. The bound: each of the
// k - 1 additions rounds by at most 2^-24 of a partial sum, and every partial sum is at most
// Σ_k |x · W| (DAZ on the bf16 dot products only matters for denormal inputs, which normal
// values never are); the bias adds one more rounding, of |y| + |bias|. The activation and a
// bf16 y add their own (activated_ref).
EpilogueRef bf16_layer_ref(const std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<float>& bias, std::int64_t m, std::int64_t n,
                           std::int64_t k) {
  EpilogueRef ref;
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (std::int64_t i = 0; i < k; ++i) {
        const double product = static_cast<double>(x[static_cast<std::size_t>(r * k + i)]) *
                               w[static_cast<std::size_t>(j * k + i)];
        sum += product;
        magnitude += std::fabs(product);
      }
      const double shift = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(j)];
      ref.expected.push_back(sum + shift);
      ref.tolerance.push_back(static_cast<double>(k) * 0x1p-24 * magnitude +
                              0x1p-24 * (std::fabs(sum) + std::fabs(shift)) + 1e-30);
    }
  }
  return ref;
}

/// The largest |y - expected| / tolerance of the bf16 tests' f32 outputs (a bf16 y's rounding
/// alone reaches its 2^-8 bound at the bottom of a binade), reported at the end, and how many
/// outputs of the AMX model had the bits of the vdpbf16ps layer.
double worst_bf16_error_ratio = 0;
std::int64_t amx_bf16_equal_bits = 0, amx_bf16_compared = 0;

template <class Y>
void record_error_ratio(const TestTensor<Y>& y, const EpilogueRef& ref) {
  if constexpr (std::is_same_v<Y, float>) {
    for (std::int64_t i = 0; i < y.size(); ++i) {
      const double expected = ref.expected[static_cast<std::size_t>(i)];
      const double tolerance = ref.tolerance[static_cast<std::size_t>(i)];
      if (std::isfinite(expected) && tolerance > 0) {
        worst_bf16_error_ratio =
            std::max(worst_bf16_error_ratio, std::fabs(y.value(i) - expected) / tolerance);
      }
    }
  }
}

/// One bf16 x bf16 layer of the sweep: bias, activation, y's dtype and strided rows of x and y
/// as `index` picks them.
template <class Y>
void check_bf16_layer(std::int64_t m, std::int64_t n, std::int64_t k, int index,
                      std::mt19937& rng) {
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  const Activation activation = activations[index % 3];
  TestTensor<bf16> weight({n, k}, index % 2 ? 3 : 0);
  weight.fill_normal(rng);
  std::vector<float> bias;
  if (index % 2 == 0) {
    std::uniform_real_distribution<float> values(-2.f, 2.f);
    for (std::int64_t j = 0; j < n; ++j) bias.push_back(values(rng));
  }
  const QuantLinear linear = QuantLinear::float_linear(
      weight.view(), bias.empty() ? TensorView{} : view(bias.data(), {n}));
  TestTensor<bf16> x({m, k}, index % 4 < 2 ? 5 : 0);  // strided rows half of the time
  x.fill_normal(rng);
  TestTensor<Y> y({m, n}, index % 3 == 1 ? 7 : 0);
  linear.forward(x.view(), y.view(), activation);
  const EpilogueRef ref =
      activated_ref(bf16_layer_ref(values_of(x), values_of(weight), bias, m, n, k), activation,
                    std::is_same_v<Y, bf16>);
  expect_within(y, ref, n,
                "bf16 layer m" + std::to_string(m) + " n" + std::to_string(n) + " k" +
                    std::to_string(k) + (std::is_same_v<Y, bf16> ? " y bf16" : " y f32") +
                    " activation " + std::to_string(static_cast<int>(activation)) +
                    (bias.empty() ? "" : " bias"));
  record_error_ratio(y, ref);
}

// The sweep over tile and chunk edges (m around the 12-row tiles, n around the 16- and 32-column
// panels, k odd, around the pairs, the 32-k AMX steps and the 256-k bf16 chunks), at every
// level. m 300 x n 3072 x k 3072 alone would be 4x the rest's reference work: left out.
TEST(QuantLinearBf16, Bf16ActivationsWithinTheBoundOfExactProducts) {
  std::mt19937 rng(2026);
  const ScopedThreads thread_count(2);
  int index = 0;
  for (std::int64_t m : {1, 7, 33, 300}) {
    for (std::int64_t n : {1, 16, 17, 100, 3072}) {
      for (std::int64_t k : {1, 31, 64, 77, 3072}) {
        if (m * n * k > 1'000'000'000) continue;
        ++index;
        if (index % 2) {
          check_bf16_layer<float>(m, n, k, index, rng);
        } else {
          check_bf16_layer<bf16>(m, n, k, index, rng);
        }
        if (HasFailure()) return;
      }
    }
  }
  std::printf("bf16 layers, f32 y: largest |error| / bound %.3g\n", worst_bf16_error_ratio);
}

TEST(QuantLinearBf16, Bf16WeightsF32Activations) { check_float<bf16, float, float>(); }
TEST(QuantLinearBf16, Bf16WeightsF32ActivationsBf16Out) { check_float<bf16, float, bf16>(); }

// fp32 x on a bf16 layer runs the fp32 FMA on the exact weights in the order fp32 panels do
// (on AVX512-BF16 the pairs widened as they are loaded): the bits of the layer built from the
// same weights as f32.
TEST(QuantLinearBf16, F32ActivationsGiveTheBitsOfF32Weights) {
  std::mt19937 rng(43);
  for (const Shape& shape : {Shape{130, 33, 777}, Shape{7, 16, 31}, Shape{250, 100, 300}}) {
    TestTensor<bf16> weight({shape.n, shape.k});
    weight.fill_normal(rng);
    const std::vector<float> widened = values_of(weight);
    const QuantLinear bf16_layer = QuantLinear::float_linear(weight.view(), {});
    const QuantLinear f32_layer =
        QuantLinear::float_linear(view(widened.data(), {shape.n, shape.k}), {});
    TestTensor<float> x({shape.m, shape.k}, 3);
    x.fill_normal(rng);
    TestTensor<float> from_bf16({shape.m, shape.n}), from_f32({shape.m, shape.n});
    bf16_layer.forward(x.view(), from_bf16.view(), Activation::silu);
    f32_layer.forward(x.view(), from_f32.view(), Activation::silu);
    EXPECT_TRUE(from_bf16.unchanged_since(from_f32.snapshot()))
        << "m" << shape.m << " n" << shape.n << " k" << shape.k;
  }
}

// fp32 x on a bf16 layer keeps all of x's bits: x = 1 + (r + 1) 2^-20 (not a bf16) times powers
// of two, its only non-zero k, gives y exactly; x rounded to bf16 would give 1 · w.
TEST(QuantLinearBf16, F32ActivationsAreNotRoundedToBf16) {
  const std::int64_t m = 13, n = 33, k = 70;
  for (std::int64_t first : {0, 1, 69}) {  // the even and the odd k of a pair, the last k
    std::vector<bf16> weight(static_cast<std::size_t>(n * k), bf16::from_float(0.f));
    for (std::int64_t j = 0; j < n; ++j) {
      weight[static_cast<std::size_t>(j * k + first)] =
          bf16::from_float(std::ldexp(1.f, static_cast<int>(j % 7) - 3));
    }
    const QuantLinear linear = QuantLinear::float_linear(view(weight.data(), {n, k}), {});
    TestTensor<float> x({m, k});
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t i = 0; i < k; ++i) {
        x.at(r * k + i) = i == first ? 1.f + static_cast<float>(r + 1) * 0x1p-20f : 0.f;
      }
    }
    TestTensor<float> y({m, n});
    linear.forward(x.view(), y.view());
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        const float want = x.at(r * k + first) * std::ldexp(1.f, static_cast<int>(j % 7) - 3);
        ASSERT_EQ(y.at(r * n + j), want) << "k " << first << " y[" << r << ", " << j << "]";
      }
    }
  }
}

// Bad arguments to a bf16 layer are refused before anything is written, as for any layer.
TEST(QuantLinearBf16, RejectsBadForwardArguments) {
  std::mt19937 rng(41);
  TestTensor<bf16> weight({8, 64});
  weight.fill_normal(rng);
  const QuantLinear linear = QuantLinear::float_linear(weight.view(), {});
  TestTensor<bf16> x({3, 64}), wrong_k({3, 63});
  TestTensor<bf16> y({3, 8}), wrong_n({3, 9});
  expect_rejected([&] { linear.forward(wrong_k.view(), y.view()); }, "in features (64)", y);
  expect_rejected([&] { linear.forward(x.view(), wrong_n.view()); }, "out features (8)", wrong_n);
  TestTensor<std::int32_t> int_x({3, 64});
  expect_rejected([&] { linear.forward(int_x.view(), y.view()); }, "x", y);
}

// ---- the AMX bf16 GEMM on the tile model -------------------------------------------------------

// The bf16 GEMM on AMX tiles (ops/linear/amx_gemm.cpp) compiled on the tile model at the
// baseline (tests/CMakeLists.txt), so its whole tile program (TDPBF16PS, which adds a pair's
// products in the ISA's order) runs on every machine: against the fp64 reference with the bound
// of bf16_layer_ref, and, where this process's layers run the vdpbf16ps kernel (the
// avx512+bf16+vnni variant without AMX-BF16), against the layer on the same data within both
// bounds (the two sum in different orders).
struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
std::unique_ptr<T[], FreeAligned> aligned_zeros(std::int64_t count) {
  const auto bytes =
      static_cast<std::size_t>((count * static_cast<std::int64_t>(sizeof(T)) + 64) / 64 * 64);
  auto* data = static_cast<T*>(std::aligned_alloc(64, bytes));
  std::memset(data, 0, bytes);
  return std::unique_ptr<T[], FreeAligned>(data);
}

template <class Y>
void check_amx_bf16_model(std::int64_t m, std::int64_t n, std::int64_t k, int index,
                          std::mt19937& rng) {
  const Activation activations[] = {Activation::none, Activation::gelu_tanh, Activation::silu};
  const Activation activation = activations[index % 3];
  const std::string what = "AMX bf16 model m" + std::to_string(m) + " n" + std::to_string(n) +
                           " k" + std::to_string(k) +
                           (std::is_same_v<Y, bf16> ? " y bf16" : " y f32") + " activation " +
                           std::to_string(static_cast<int>(activation));
  TestTensor<bf16> weight({n, k});
  weight.fill_normal(rng);
  TestTensor<bf16> x({m, k}, 3);
  x.fill_normal(rng);
  std::vector<float> bias;
  if (index % 2 == 0) {
    std::uniform_real_distribution<float> values(-2.f, 2.f);
    for (std::int64_t j = 0; j < n; ++j) bias.push_back(values(rng));
  }
  // The layer's packing for the avx512+bf16+vnni variant: panels of 16 or 32 columns, pairs of
  // k (word i · cols + j of a panel: k 2i and 2i + 1 of column j), k padded to 32; bias padded.
  const std::int64_t cols = n <= 16 ? 16 : 32, k_padded = (k + 31) / 32 * 32;
  const std::int64_t panels = (n + cols - 1) / cols, panel_words = k_padded * cols;
  auto packed = aligned_zeros<std::uint16_t>(panels * panel_words);
  auto padded_bias = aligned_zeros<float>(panels * cols);
  for (std::int64_t j = 0; j < n; ++j) {
    std::uint16_t* panel = packed.get() + (j / cols) * panel_words + (j % cols) * 2;
    for (std::int64_t i = 0; i < k; ++i)
      panel[(i / 2) * cols * 2 + i % 2] = weight.at(j * k + i).bits;
    if (!bias.empty()) padded_bias[static_cast<std::size_t>(j)] = bias[static_cast<std::size_t>(j)];
  }
  auto a = aligned_zeros<bf16>(m * k_padded);  // x's rows, k_padded apart, zeros past k
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t i = 0; i < k; ++i)
      a[static_cast<std::size_t>(r * k_padded + i)] = x.at(r * k + i);
  }
  TestTensor<Y> y({m, n}, 5);
  linear::GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_dtype = DType::bf16;
  p.y_dtype = std::is_same_v<Y, bf16> ? DType::bf16 : DType::f32;
  p.x = a.get();
  p.rows.dims = 1;
  p.rows.shape[0] = m;
  p.rows.rows = m;
  p.rows.strides[linear::kX][0] = k_padded;
  p.rows.strides[linear::kY][0] = y.view().strides[0];
  p.y = y.view().data;
  p.panels = packed.get();
  p.weight_dtype = DType::bf16;
  p.panel_bytes = panel_words * 2;
  p.columns = static_cast<int>(cols);
  p.k_padded = k_padded;
  p.bias = bias.empty() ? nullptr : padded_bias.get();
  p.activation = activation;
  // As the layer calls it: blocks of whole 32-row blocks filling 1 MiB (up to 256 rows), the
  // last one short, the panels in two chunks.
  const std::int64_t block_rows =
      std::clamp<std::int64_t>(1024 * 1024 / (k_padded * 2) / 32, 1, 8) * 32;
  const std::int64_t split = (panels + 1) / 2;
  for (std::int64_t row0 = 0; row0 < m; row0 += block_rows) {
    const std::int64_t row_end = std::min(m, row0 + block_rows);
    linear::amx_model::gemm_bf16_amx<xsimd::sse2>(p, a.get() + row0 * k_padded, row0, row_end, 0,
                                                  split);
    linear::amx_model::gemm_bf16_amx<xsimd::sse2>(p, a.get() + row0 * k_padded, row0, row_end,
                                                  split, panels);
  }
  const EpilogueRef ref =
      activated_ref(bf16_layer_ref(values_of(x), values_of(weight), bias, m, n, k), activation,
                    std::is_same_v<Y, bf16>);
  expect_within(y, ref, n, what);
  record_error_ratio(y, ref);

  if (core::kernel_variant() != core::kAvx512Bf16Variant || core::amx_usable(core::AmxUnit::bf16)) {
    return;
  }
  const QuantLinear linear = QuantLinear::float_linear(
      weight.view(), bias.empty() ? TensorView{} : view(bias.data(), {n}));
  TestTensor<Y> layer_y({m, n});
  linear.forward(x.view(), layer_y.view(), activation);
  EpilogueRef both;
  both.expected.resize(static_cast<std::size_t>(m * n));
  both.tolerance.resize(both.expected.size());
  for (std::int64_t i = 0; i < m * n; ++i) {
    both.expected[static_cast<std::size_t>(i)] = layer_y.value(i);
    both.tolerance[static_cast<std::size_t>(i)] = 2 * ref.tolerance[static_cast<std::size_t>(i)];
    if (same_bits(layer_y.at(i), y.at(i))) ++amx_bf16_equal_bits;
  }
  amx_bf16_compared += m * n;
  expect_within(y, both, n, what + " against the vdpbf16ps layer");
}

TEST(AmxBf16GemmModel, WithinTheBoundOfExactProducts) {
  std::mt19937 rng(32);
  worst_bf16_error_ratio = 0;
  int index = 0;
  for (std::int64_t m : {1, 7, 33, 300}) {
    for (std::int64_t n : {1, 16, 17, 100}) {
      for (std::int64_t k : {1, 31, 64, 77, 3072}) {
        if (m == 300 && k == 3072 && n > 17) continue;  // the model's slowest; 33 rows cover it
        ++index;
        if (index % 2) {
          check_amx_bf16_model<float>(m, n, k, index, rng);
        } else {
          check_amx_bf16_model<bf16>(m, n, k, index, rng);
        }
        if (HasFailure()) return;
      }
    }
  }
  check_amx_bf16_model<bf16>(33, 3072, 77, 1, rng);
  std::printf("AMX bf16 model, f32 y: largest |error| / bound %.3g\n", worst_bf16_error_ratio);
  if (amx_bf16_compared > 0) {
    std::printf("AMX bf16 model: %lld of %lld outputs the same bits as the vdpbf16ps layer\n",
                static_cast<long long>(amx_bf16_equal_bits),
                static_cast<long long>(amx_bf16_compared));
  }
}

// Where AMX-BF16 is used (DITOPS_ISA unset or amx on a CPU with it: tools/amx-check.sh), the
// layer's bf16 x runs the library's TDPBF16PS kernel on the instructions: a part of the sweep
// through the layer, against the same reference and bound.
TEST(AmxBf16GemmHardware, LayersWithinTheBoundOfExactProducts) {
  if (!core::amx_usable(core::AmxUnit::bf16)) {
    GTEST_SKIP() << "AMX bf16 not used here: " << core::amx_reason(core::AmxUnit::bf16);
  }
  std::mt19937 rng(44);
  int index = 0;
  for (std::int64_t m : {1, 7, 33, 300}) {
    for (std::int64_t n : {1, 16, 17, 100}) {
      for (std::int64_t k : {1, 31, 64, 77, 3072}) {
        ++index;
        if (index % 2) {
          check_bf16_layer<float>(m, n, k, index, rng);
        } else {
          check_bf16_layer<bf16>(m, n, k, index, rng);
        }
        if (HasFailure()) return;
      }
    }
  }
}

// ---- fused QKV ----------------------------------------------------------------------------------

/// Each part of `fused` (parts side by side, `widths` outputs each) run alone on x gives the
/// fused layer's columns bit for bit.
template <class X>
void expect_parts_bitwise(const QuantLinear& fused, const std::vector<QuantLinear>& parts,
                          const std::vector<std::int64_t>& widths, TestTensor<X>& x,
                          const std::string& what) {
  const std::int64_t m = x.shape()[0], n = fused.out_features();
  TestTensor<float> y({m, n});
  fused.forward(x.view(), y.view());
  std::int64_t first = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    TestTensor<float> part_y({m, widths[p]});
    parts[p].forward(x.view(), part_y.view());
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < widths[p]; ++j) {
        ASSERT_TRUE(same_bits(y.at(r * n + first + j), part_y.at(r * widths[p] + j)))
            << what << " part " << p << " row " << r << " column " << j;
      }
    }
    first += widths[p];
  }
}

// The fused layer runs the same kernel on the same quantized rows, so its columns are bitwise
// those of each part run alone.
TEST(QuantLinear, ConcatOutputsEqualsItsParts) {
  std::mt19937 rng(17);
  const std::int64_t m = 11, k = 96;
  const std::int64_t widths[] = {40, 24, 24};
  for (QuantAlgo algo :
       {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::float_linear}) {
    std::vector<Int8Layer> layers;
    std::vector<std::vector<float>> float_weights;
    std::vector<QuantLinear> parts;
    for (std::int64_t width : widths) {
      layers.push_back(random_layer(width, k, rng, width == 24, false));
      Int8Layer& layer = layers.back();
      layer.input_scale = {0.03f};
      layer.input_offset = {1.f};
      if (algo == QuantAlgo::float_linear) {
        float_weights.emplace_back(layer.weight.begin(), layer.weight.end());
        parts.push_back(QuantLinear::float_linear(
            view(float_weights.back().data(), {width, k}),
            layer.bias.empty() ? TensorView{} : view(layer.bias.data(), {width})));
      } else {
        parts.push_back(QuantLinear::w8a8(algo, layer.tensors()));
      }
    }
    const QuantLinear fused = QuantLinear::concat_outputs(parts);
    ASSERT_EQ(fused.out_features(), 88);
    TestTensor<float> x({m, k});
    x.fill_normal(rng);
    expect_parts_bitwise(fused, parts, {widths, widths + 3}, x, quant_algo_name(algo));
  }
}

// Parts of bf16 weights fuse into a layer of bf16 weights (bf16 x: the same kernel, the bits of
// each part); a bf16 part beside an f32 part is widened into an f32 layer, whose fp32 x gives
// the bits of each part too (fp32 x on bf16 pairs sums as fp32 panels do).
TEST(QuantLinearBf16, ConcatOutputsEqualsItsParts) {
  std::mt19937 rng(47);
  const std::int64_t m = 13, k = 77;
  const std::int64_t widths[] = {40, 24, 17};
  for (bool mixed : {false, true}) {
    std::vector<TestTensor<bf16>> bf16_weights;
    std::vector<TestTensor<float>> f32_weights;
    std::vector<QuantLinear> parts;
    for (std::int64_t width : widths) {
      if (mixed && width == 24) {
        f32_weights.emplace_back(std::vector<std::int64_t>{width, k});
        f32_weights.back().fill_normal(rng);
        parts.push_back(QuantLinear::float_linear(f32_weights.back().view(), {}));
      } else {
        bf16_weights.emplace_back(std::vector<std::int64_t>{width, k});
        bf16_weights.back().fill_normal(rng);
        parts.push_back(QuantLinear::float_linear(bf16_weights.back().view(), {}));
      }
    }
    const QuantLinear fused = QuantLinear::concat_outputs(parts);
    ASSERT_EQ(fused.out_features(), 81);
    const std::string what = mixed ? "bf16 and f32 parts" : "bf16 parts";
    TestTensor<float> x({m, k});
    x.fill_normal(rng);
    expect_parts_bitwise(fused, parts, {widths, widths + 3}, x, what);
    if (!mixed) {
      TestTensor<bf16> x_bf16({m, k});
      x_bf16.fill_normal(rng);
      expect_parts_bitwise(fused, parts, {widths, widths + 3}, x_bf16, what);
    }
  }
}

// ---- activations --------------------------------------------------------------------------------

// gelu_tanh and silu applied by the epilogue, against activated_ref (its comment derives the
// bound: the layer's own fp32 error, the rounding of the sigmoid's argument, the exp2
// polynomial's 2e-7): every algorithm, the tile-edge shapes (odd m, n off the panel width),
// f32 and bf16 outputs. The layers' outputs reach from about +-1 (small k) to several tens,
// on both sides of where the sigmoid saturates.
template <class Y>
void check_activations(QuantAlgo algo) {
  std::mt19937 rng(31);
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (const Shape& shape : kShapes) {
      for (Activation activation : {Activation::gelu_tanh, Activation::silu}) {
        Int8Layer layer = random_layer(shape.n, shape.k, rng, true, false);
        layer.input_scale = {0.02f};
        layer.input_offset = {3.f};
        TestTensor<float> float_weight({shape.n, shape.k});
        float_weight.fill_normal(rng);
        const QuantLinear linear =
            algo == QuantAlgo::float_linear
                ? QuantLinear::float_linear(float_weight.view(), view(layer.bias.data(), {shape.n}))
                : QuantLinear::w8a8(algo, layer.tensors());
        TestTensor<float> x({shape.m, shape.k}, /*row_pad=*/2);
        x.fill_normal(rng);
        TestTensor<Y> y({shape.m, shape.n});
        linear.forward(x.view(), y.view(), activation);

        EpilogueRef layer_ref;
        if (algo == QuantAlgo::float_linear) {
          layer_ref.expected = float_matmul_ref(values_of(x), values_of(float_weight), layer.bias,
                                                shape.m, shape.n, shape.k);
          for (double v : layer_ref.expected)
            layer_ref.tolerance.push_back(float_layer_tolerance(shape.k, v));
        } else {
          RefQuant quant;
          quant.dynamic = algo == QuantAlgo::w8a8_dynamic;
          quant.scale = layer.input_scale[0];
          quant.offset = layer.input_offset[0];
          std::vector<std::int32_t> q;
          std::vector<double> row_scale;
          quantize_ref(values_of(x), shape.m, shape.k, quant, q, row_scale);
          const auto acc = int_matmul_ref(q, layer.weight, shape.m, shape.n, shape.k);
          std::vector<double> column_offset(static_cast<std::size_t>(shape.n), 0.0);
          const std::vector<float>* column_scale = &layer.weight_scale;
          if (algo == QuantAlgo::w8a8_static) {
            std::fill(row_scale.begin(), row_scale.end(), 1.0);
            column_offset.assign(layer.quant_bias.begin(), layer.quant_bias.end());
            column_scale = &layer.deq_scale;
          }
          layer_ref = epilogue_ref(acc, row_scale, *column_scale, column_offset, layer.bias,
                                   shape.m, shape.n, /*bf16_output=*/false);
        }
        expect_within(y, activated_ref(layer_ref, activation, std::is_same_v<Y, bf16>), shape.n,
                      std::string(quant_algo_name(algo)) +
                          (activation == Activation::silu ? " silu" : " gelu_tanh") + " m" +
                          std::to_string(shape.m) + " n" + std::to_string(shape.n) + " k" +
                          std::to_string(shape.k) + " threads " + std::to_string(threads));
      }
    }
  }
}

TEST(QuantLinear, ActivationStaticF32) { check_activations<float>(QuantAlgo::w8a8_static); }
TEST(QuantLinear, ActivationDynamicBf16) { check_activations<bf16>(QuantAlgo::w8a8_dynamic); }
TEST(QuantLinear, ActivationFloatF32) { check_activations<float>(QuantAlgo::float_linear); }
TEST(QuantLinear, ActivationFloatBf16) { check_activations<bf16>(QuantAlgo::float_linear); }

// Outputs far out on both sides: a FLOAT layer with k = 1 gives y[r, j] = x[r] · w[j] exactly
// (w powers of two), so x = +-inf, NaN, +-1e4 and values around where exp underflows (t below
// -87: sigmoid below 2^-126) reach the activation as they are; an int8 layer gets there
// through its bias. -inf and overflowing exponentials give -0, never NaN; NaN stays NaN.
template <class Y>
void check_activation_extremes() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> rows = {kInf,  -kInf, std::nanf(""), 1e4f, -1e4f, 100.f, -100.f, 88.f,
                                   -88.f, -87.f, -44.f,         9.f,  -9.f,  0.f,   -0.f};
  const std::int64_t m = static_cast<std::int64_t>(rows.size()), n = 19;
  std::vector<float> weight, bias;
  for (std::int64_t j = 0; j < n; ++j) {
    weight.push_back(std::ldexp(j % 2 ? -1.f : 1.f, static_cast<int>(j % 5) - 2));
    bias.push_back(std::ldexp(j % 2 ? -1.f : 1.f, static_cast<int>(j % 7) * 2));  // to +-4096
  }
  bias[3] = 1e4f;
  bias[4] = -1e4f;
  std::mt19937 rng(37);
  Int8Layer int8_layer = random_layer(n, 1, rng, true, false);
  int8_layer.bias = bias;
  const QuantLinear float_linear = QuantLinear::float_linear(view(weight.data(), {n, 1}), {});
  const QuantLinear int8_linear = QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, int8_layer.tensors());
  TestTensor<float> x({m, 1});
  for (std::int64_t r = 0; r < m; ++r) x.at(r) = rows[static_cast<std::size_t>(r)];
  TestTensor<float> finite_x({m, 1});
  for (std::int64_t r = 0; r < m; ++r) finite_x.at(r) = static_cast<float>(r) - 7.f;
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (Activation activation : {Activation::gelu_tanh, Activation::silu}) {
      const std::string what = std::string(activation == Activation::silu ? "silu" : "gelu_tanh") +
                               " threads " + std::to_string(threads);
      TestTensor<Y> y({m, n});
      float_linear.forward(x.view(), y.view(), activation);
      EpilogueRef layer_ref;
      layer_ref.expected = float_matmul_ref(rows, weight, {}, m, n, 1);
      layer_ref.tolerance.assign(layer_ref.expected.size(), 0.0);  // products by powers of two
      expect_within(y, activated_ref(layer_ref, activation, std::is_same_v<Y, bf16>), n,
                    "FLOAT " + what);
      for (std::int64_t r = 0; r < m; ++r) {  // NaN out for the NaN row only
        for (std::int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(std::isnan(y.value(r * n + j)), r == 2) << what << " row " << r;
        }
      }

      TestTensor<Y> int8_y({m, n});
      int8_linear.forward(finite_x.view(), int8_y.view(), activation);
      RefQuant quant;
      quant.dynamic = true;
      std::vector<std::int32_t> q;
      std::vector<double> row_scale;
      quantize_ref(values_of(finite_x), m, 1, quant, q, row_scale);
      const EpilogueRef int8_ref = epilogue_ref(
          int_matmul_ref(q, int8_layer.weight, m, n, 1), row_scale, int8_layer.weight_scale,
          std::vector<double>(static_cast<std::size_t>(n), 0.0), bias, m, n, false);
      expect_within(int8_y, activated_ref(int8_ref, activation, std::is_same_v<Y, bf16>), n,
                    "W8A8_DYNAMIC " + what);
    }
  }
}

TEST(QuantLinear, ActivationExtremesF32) { check_activation_extremes<float>(); }
TEST(QuantLinear, ActivationExtremesBf16) { check_activation_extremes<bf16>(); }

// ---- strided y ----------------------------------------------------------------------------------

// y as the middle third of a fused [batch, rows + 2, 3 · n] buffer: rows 3 · n apart, batches
// two spare rows apart. The kernels store the same values at other addresses, so y equals the
// contiguous output bitwise, and every other element of the buffer keeps its canary. Batches of
// 7 rows put the tile edges (4, 6, 8, 12 rows) inside batches and across them.
template <class Y>
void expect_strided_y_equals_contiguous(const QuantLinear& linear, TestTensor<float>& x,
                                        const std::string& what) {
  const std::int64_t batch = x.shape()[0], rows = x.shape()[1], n = linear.out_features();
  const std::int64_t row_stride = 3 * n, batch_stride = (rows + 2) * row_stride;
  TestTensor<Y> contiguous({batch, rows, n});
  linear.forward(x.view(), contiguous.view());
  std::vector<Y> fused(static_cast<std::size_t>(batch * batch_stride), canary<Y>());
  linear.forward(x.view(), view(fused.data() + n, {batch, rows, n}, {batch_stride, row_stride, 1}));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows + 2; ++r) {
      for (std::int64_t c = 0; c < row_stride; ++c) {
        const Y got = fused[static_cast<std::size_t>(b * batch_stride + r * row_stride + c)];
        const bool in_y = r < rows && c >= n && c < 2 * n;
        const Y want = in_y ? contiguous.at((b * rows + r) * n + c - n) : canary<Y>();
        ASSERT_TRUE(same_bits(got, want)) << what << " batch " << b << " row " << r << " column "
                                          << c << (in_y ? " (in y)" : " (outside y)");
      }
    }
  }
}

TEST(QuantLinear, StridedOutputEqualsContiguous) {
  std::mt19937 rng(29);
  const std::int64_t batch = 3, rows = 7, n = 37, k = 70;
  for (int threads : {1, 2}) {
    const ScopedThreads thread_count(threads);
    for (QuantAlgo algo :
         {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::float_linear}) {
      Int8Layer layer = random_layer(n, k, rng, true, false);
      layer.input_scale = {0.03f};
      layer.input_offset = {1.f};
      const std::vector<float> float_weight(layer.weight.begin(), layer.weight.end());
      const QuantLinear linear = algo == QuantAlgo::float_linear
                                     ? QuantLinear::float_linear(view(float_weight.data(), {n, k}),
                                                                 view(layer.bias.data(), {n}))
                                     : QuantLinear::w8a8(algo, layer.tensors());
      TestTensor<float> x({batch, rows, k}, /*row_pad=*/3);
      x.fill_normal(rng);
      const std::string what =
          std::string(quant_algo_name(algo)) + " threads " + std::to_string(threads);
      expect_strided_y_equals_contiguous<float>(linear, x, what + " f32 y");
      expect_strided_y_equals_contiguous<bf16>(linear, x, what + " bf16 y");
    }
  }
}

// ---- bad arguments ------------------------------------------------------------------------------

TEST(QuantLinear, RejectsBadLayers) {
  std::mt19937 rng(19);
  Int8Layer layer = random_layer(8, 16, rng, true, false);
  layer.input_scale = {0.1f};
  layer.input_offset = {0.f};
  const auto expect_error = [](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no ditops::Error for " << needle;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  expect_error([&] { QuantLinear::w8a8(QuantAlgo::float_linear, layer.tensors()); }, "algo");
  expect_error([&] { QuantLinear::w8a8(QuantAlgo::w8a8_timestep, layer.tensors()); }, "timestep");
  expect_error(
      [&] {
        QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, layer.tensors(), std::make_shared<Timestep>());
      },
      "timestep");
  {
    Int8Layer bad = layer;
    bad.deq_scale[3] = std::nanf("");
    expect_error([&] { QuantLinear::w8a8(QuantAlgo::w8a8_static, bad.tensors()); }, "deq_scale[3]");
  }
  {
    Int8Layer bad = layer;
    bad.input_scale = {0.f};
    expect_error([&] { QuantLinear::w8a8(QuantAlgo::w8a8_static, bad.tensors()); }, "input_scale");
  }
  {
    Int8Layer bad = layer;
    bad.weight_scale.pop_back();
    W8A8Tensors tensors = bad.tensors();
    tensors.weight_scale = view(bad.weight_scale.data(), {7});
    expect_error([&] { QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, tensors); }, "weight_scale");
  }
  {
    W8A8Tensors tensors = layer.tensors();
    std::vector<float> wrong(8 * 16);
    tensors.weight = view(wrong.data(), {8, 16});
    expect_error([&] { QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, tensors); }, "weight");
  }
  {
    Int8Layer bad = layer;
    bad.input_scale = {0.1f, 0.2f};
    bad.input_offset = {0.f, 0.5f};
    expect_error(
        [&] {
          QuantLinear::w8a8(QuantAlgo::w8a8_timestep, bad.tensors(), std::make_shared<Timestep>());
        },
        "input_offset[1]");
  }
  expect_error([] { TimestepPolicy().set(3, 2, TimestepMode::dynamic); }, "3..2");
  expect_error([] { Timestep().set_step(-1); }, "step");
  expect_error([] { QuantLinear::concat_outputs({}); }, "parts");
  {
    const QuantLinear a = QuantLinear::w8a8(QuantAlgo::w8a8_static, layer.tensors());
    Int8Layer other = layer;
    other.input_scale = {0.2f};
    const QuantLinear b = QuantLinear::w8a8(QuantAlgo::w8a8_static, other.tensors());
    expect_error([&] { QuantLinear::concat_outputs({a, b}); }, "parts[1]");
    const QuantLinear c = QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, layer.tensors());
    expect_error([&] { QuantLinear::concat_outputs({a, c}); }, "parts[1]");
  }
}

// Every value linear.hpp promises to check, one violation at a time, on the algorithms that
// read the value: each is refused naming the argument and the element.
TEST(QuantLinear, RejectsEveryValueOutsideItsPromise) {
  std::mt19937 rng(31);
  Int8Layer good = random_layer(4, 6, rng, true, true);
  good.input_scale = {0.1f};
  good.input_offset = {2.f};
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<QuantAlgo> algos;
    std::function<void(Int8Layer&)> change;
    std::string needle;
  };
  const QuantAlgo st = QuantAlgo::w8a8_static, dyn = QuantAlgo::w8a8_dynamic,
                  ts = QuantAlgo::w8a8_timestep;
  const std::vector<Case> cases = {
      {{dyn, ts}, [](Int8Layer& l) { l.weight_scale[1] = -0.5f; }, "weight_scale[1]"},
      {{dyn, ts}, [](Int8Layer& l) { l.weight_scale[2] = 0.f; }, "weight_scale[2]"},
      {{dyn, ts}, [&](Int8Layer& l) { l.weight_scale[0] = inf; }, "weight_scale[0]"},
      {{st}, [](Int8Layer& l) { l.deq_scale[2] = -0.01f; }, "deq_scale[2]"},
      {{st}, [](Int8Layer& l) { l.deq_scale[0] = 0.f; }, "deq_scale[0]"},
      {{st, ts}, [](Int8Layer& l) { l.input_scale[0] = -0.1f; }, "input_scale[0]"},
      {{st, ts}, [&](Int8Layer& l) { l.input_offset[0] = nan; }, "input_offset[0]"},
      {{st, dyn, ts}, [](Int8Layer& l) { l.smooth[5] = -1.f; }, "smooth_scale[5]"},
      {{st, dyn, ts}, [](Int8Layer& l) { l.smooth[3] = 0.f; }, "smooth_scale[3]"},
      {{st, dyn, ts}, [&](Int8Layer& l) { l.smooth[0] = nan; }, "smooth_scale[0]"},
      {{st, dyn, ts}, [&](Int8Layer& l) { l.bias[3] = inf; }, "bias[3]"},
      {{st, dyn, ts}, [&](Int8Layer& l) { l.bias[1] = nan; }, "bias[1]"},
  };
  for (const Case& c : cases) {
    for (const QuantAlgo algo : c.algos) {
      SCOPED_TRACE(std::string(quant_algo_name(algo)) + " " + c.needle);
      Int8Layer bad = good;
      c.change(bad);
      std::shared_ptr<const Timestep> timestep;
      if (algo == ts) timestep = std::make_shared<Timestep>();
      ASSERT_NO_THROW(QuantLinear::w8a8(algo, good.tensors(), timestep));
      try {
        QuantLinear::w8a8(algo, bad.tensors(), timestep);
        ADD_FAILURE() << "accepted";
      } catch (const Error& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("QuantLinear::w8a8"), std::string::npos) << message;
        EXPECT_NE(message.find(c.needle), std::string::npos) << message;
      }
    }
  }
  // Types and shapes: quant_bias i32, a static layer's one input_scale, float weights.
  {
    W8A8Tensors tensors = good.tensors();
    std::vector<float> float_bias(4);
    tensors.quant_bias = view(float_bias.data(), {4});
    EXPECT_THROW(QuantLinear::w8a8(st, tensors), Error);
  }
  {
    Int8Layer two_steps = good;
    two_steps.input_scale = {0.1f, 0.2f};
    two_steps.input_offset = {0.f, 1.f};
    EXPECT_THROW(QuantLinear::w8a8(st, two_steps.tensors()), Error);
  }
  std::vector<float> weight(4 * 6, 1.f), bias(4, 0.f);
  bias[2] = nan;
  EXPECT_THROW(QuantLinear::float_linear(view(weight.data(), {4, 6}), view(bias.data(), {4})),
               Error);
  std::vector<std::int32_t> int_weight(4 * 6);
  EXPECT_THROW(QuantLinear::float_linear(view(int_weight.data(), {4, 6}), {}), Error);
  EXPECT_THROW(TimestepPolicy().set(-1, 2, TimestepMode::dynamic), Error);
  // Fused parts must quantize x alike: another smooth_scale or another model's timestep.
  const QuantLinear a = QuantLinear::w8a8(dyn, good.tensors());
  Int8Layer other_smooth = good;
  other_smooth.smooth[0] *= 2;
  EXPECT_THROW(QuantLinear::concat_outputs({a, QuantLinear::w8a8(dyn, other_smooth.tensors())}),
               Error);
  const QuantLinear t1 = QuantLinear::w8a8(ts, good.tensors(), std::make_shared<Timestep>());
  const QuantLinear t2 = QuantLinear::w8a8(ts, good.tensors(), std::make_shared<Timestep>());
  EXPECT_THROW(QuantLinear::concat_outputs({t1, t2}), Error);
}

TEST(QuantLinear, RejectsBadForwardArguments) {
  std::mt19937 rng(23);
  Int8Layer layer = random_layer(8, 16, rng, false, false);
  const QuantLinear linear = QuantLinear::w8a8(QuantAlgo::w8a8_dynamic, layer.tensors());
  TestTensor<float> x({3, 16});
  TestTensor<float> y({3, 8});
  TestTensor<float> wrong_k({3, 15});
  expect_rejected([&] { linear.forward(wrong_k.view(), y.view()); }, "in features (16)", y);
  TestTensor<float> wrong_n({3, 9});
  expect_rejected([&] { linear.forward(x.view(), wrong_n.view()); }, "out features (8)", wrong_n);
  TestTensor<float> wrong_rows({4, 8});
  expect_rejected([&] { linear.forward(x.view(), wrong_rows.view()); }, "y has shape", wrong_rows);
  TestTensor<float> wide_y({3, 16});
  TensorView strided_columns = wide_y.view();
  strided_columns.shape[1] = 8;
  strided_columns.strides[1] = 2;
  expect_rejected([&] { linear.forward(x.view(), strided_columns); },
                  "QuantLinear::forward: y.strides[1]", wide_y);
  expect_rejected([&] { linear.forward(x.view(), y.view(), static_cast<Activation>(3)); },
                  "QuantLinear::forward: activation (3)", y);
  TestTensor<std::int32_t> int_x({3, 16});
  expect_rejected([&] { linear.forward(int_x.view(), y.view()); }, "x", y);
  // y over x: [3, 16] floats viewed as y [3, 8] shares x's memory.
  TensorView aliased = x.view();
  aliased.shape[1] = 8;
  aliased.strides[0] = 8;
  expect_rejected([&] { linear.forward(x.view(), aliased); }, "overlap", x);
  TestTensor<float> empty_x({0, 16});
  TestTensor<float> empty_y({0, 8});
  linear.forward(empty_x.view(), empty_y.view());  // no rows: nothing to do
  EXPECT_THROW(QuantLinear(nullptr).forward(x.view(), y.view()), Error);
}

}  // namespace
}  // namespace ditops::test
