// Linear layers on buffers as users allocate them: the weights a layer is built from and the x
// and y of its forward, starting at every offset within a cache line (16 bytes past one is
// where malloc and numpy put large arrays), give the bits of the line-aligned run and write
// nothing outside y: float layers (f32 and bf16 weights and activations) and W8A8 static and
// dynamic layers (f32 and bf16 activations), with an epilogue, 2 threads. M, N and K leave
// partial tiles.

#include "tests/support/line_offsets.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <ditops/linear.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/support/scoped_threads.hpp"

namespace ditops::test {
namespace {

constexpr std::int64_t kM = 37, kN = 53, kK = 203;

/// The forward of the layer make_layer(offset) builds from tensors `offset` bytes past a line,
/// x and y placed there too, at every multiple of `step` (the smallest element size among them).
template <class X, class Y, class MakeLayer>
void expect_forward_offsets_equal(std::size_t step, const MakeLayer& make_layer,
                                  const std::string& context) {
  const ScopedThreads threads(2);
  const std::vector<X> x0 = normal_values<X>(static_cast<std::size_t>(kM * kK), 7);
  OffsetBuffer<X> x(x0.size());
  OffsetBuffer<Y> y(static_cast<std::size_t>(kM * kN));
  const auto run = [&](std::size_t offset) {
    const QuantLinear layer = make_layer(offset);
    Y* result = y.place(offset);
    layer.forward(view(x.place_copy(offset, x0), {kM, kK}), view(result, {kM, kN}),
                  Activation::gelu_tanh);
    EXPECT_TRUE(y.guards_intact()) << "offset " << offset;
    return bytes_of(result, static_cast<std::size_t>(kM * kN));
  };
  expect_every_offset_equals_aligned(step, run, context);
}

template <class W, class X, class Y>
void expect_float_layer_offsets_equal() {
  const std::vector<W> weight0 = normal_values<W>(static_cast<std::size_t>(kN * kK), 5);
  const std::vector<float> bias0 = normal_values<float>(static_cast<std::size_t>(kN), 6);
  OffsetBuffer<W> weight(weight0.size());
  OffsetBuffer<float> bias(bias0.size());
  const auto make_layer = [&](std::size_t offset) {
    return QuantLinear::float_linear(view(weight.place_copy(offset, weight0), {kN, kK}),
                                     view(bias.place_copy(offset, bias0), {kN}));
  };
  expect_forward_offsets_equal<X, Y>(
      std::min({sizeof(W), sizeof(X), sizeof(Y)}), make_layer,
      std::string("float layer, weights ") + dtype_name(detail::dtype_of<W>()) + ", x " +
          dtype_name(detail::dtype_of<X>()) + ", y " + dtype_name(detail::dtype_of<Y>()));
}

TEST(QuantLinearLineOffsets, FloatLayersEqualTheAlignedRun) {
  expect_float_layer_offsets_equal<float, float, float>();
  expect_float_layer_offsets_equal<bf16, bf16, bf16>();
  expect_float_layer_offsets_equal<float, bf16, float>();
}

template <class X, class Y>
void expect_w8a8_offsets_equal(QuantAlgo algo) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(-127, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  std::vector<std::int8_t> weight0(static_cast<std::size_t>(kN * kK));
  for (std::int8_t& w : weight0) w = static_cast<std::int8_t>(byte(rng));
  std::vector<float> scales0(static_cast<std::size_t>(kN)), bias0 = scales0;
  for (float& s : scales0) s = scale(rng);
  for (float& b : bias0) b = scale(rng) * 100.f - 1.f;
  std::vector<std::int32_t> quant_bias0(scales0.size());
  for (std::int32_t& b : quant_bias0) b = byte(rng) * 40;
  const std::vector<float> input_scale0 = {0.03f}, input_offset0 = {2.f};
  OffsetBuffer<std::int8_t> weight(weight0.size());
  OffsetBuffer<float> weight_scale(scales0.size()), deq_scale(scales0.size()), bias(bias0.size()),
      input_scale(1), input_offset(1);
  OffsetBuffer<std::int32_t> quant_bias(quant_bias0.size());
  const auto make_layer = [&](std::size_t offset) {
    W8A8Tensors t;
    t.weight = view(weight.place_copy(offset, weight0), {kN, kK});
    t.weight_scale = view(weight_scale.place_copy(offset, scales0), {kN});
    t.deq_scale = view(deq_scale.place_copy(offset, scales0), {kN});
    t.quant_bias = view(quant_bias.place_copy(offset, quant_bias0), {kN});
    t.input_scale = view(input_scale.place_copy(offset, input_scale0), {1});
    t.input_offset = view(input_offset.place_copy(offset, input_offset0), {1});
    t.bias = view(bias.place_copy(offset, bias0), {kN});
    return QuantLinear::w8a8(algo, t);
  };
  expect_forward_offsets_equal<X, Y>(1, make_layer,
                                     std::string(quant_algo_name(algo)) + ", x " +
                                         dtype_name(detail::dtype_of<X>()) + ", y " +
                                         dtype_name(detail::dtype_of<Y>()));
}

TEST(QuantLinearLineOffsets, W8A8LayersEqualTheAlignedRun) {
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    expect_w8a8_offsets_equal<float, float>(algo);
    expect_w8a8_offsets_equal<bf16, bf16>(algo);
  }
}

}  // namespace
}  // namespace ditops::test
