// QuantLinear over its argument space: every algorithm, layers built from tensors of any
// length, dtype and value (NaN and zero scales, -128 weights, SmoothQuant factors, per-step
// parameters), forward calls with f32 / bf16 activations and outputs, ranks 1-3, strided rows,
// broken and aliasing outputs, each output activation, concat_outputs of compatible and
// incompatible parts. Accepted calls with finite inputs are checked against the exact-integer
// reference (activated in fp64).

#include <ditops/linear.hpp>

#include "fuzz/support.hpp"
#include "tests/reference/linear_ref.hpp"

namespace ditops::fuzz {
namespace {

struct Layer {
  std::int64_t n = 0, k = 0;
  std::vector<std::int8_t> weight;
  std::vector<float> weight_scale, deq_scale, bias, smooth, input_scale, input_offset;
  std::vector<std::int32_t> quant_bias;
};

/// A vector of `length` floats, usually `ordinary`, now and then an edge value.
std::vector<float> floats(Input& in, std::int64_t length, float ordinary) {
  std::vector<float> values(static_cast<std::size_t>(length), ordinary);
  if (length > 0 && in.rarely(8)) {
    values[static_cast<std::size_t>(in.size(0, length - 1))] = in.edge_float(ordinary);
  }
  return values;
}

Layer make_layer(Input& in, std::mt19937& rng, std::int64_t n, std::int64_t k, int steps) {
  Layer layer;
  layer.n = n;
  layer.k = k;
  std::uniform_int_distribution<int> level(-127, 127);
  for (std::int64_t i = 0; i < n * k; ++i)
    layer.weight.push_back(static_cast<std::int8_t>(level(rng)));
  if (!layer.weight.empty() && in.rarely(4)) layer.weight[rng() % layer.weight.size()] = -128;
  layer.weight_scale = floats(in, n, 0.01f);
  layer.deq_scale = floats(in, n, 0.001f);
  for (std::int64_t j = 0; j < n; ++j) {
    layer.quant_bias.push_back(static_cast<std::int32_t>(rng() % 20001) - 10000);
  }
  if (in.flag()) layer.bias = floats(in, n, 0.5f);
  if (in.rarely(4)) layer.smooth = floats(in, k, 1.5f);
  for (int t = 0; t < steps; ++t) {
    layer.input_scale.push_back(in.rarely(16) ? in.edge_float(0.03f) : 0.01f + 0.01f * t);
    layer.input_offset.push_back(in.rarely(16) ? in.edge_float(2.f)
                                               : static_cast<float>(t % 5) - 2.f);
  }
  return layer;
}

W8A8Tensors tensors_of(Layer& layer, Input& in) {
  W8A8Tensors t;
  const std::int64_t n = layer.n;
  t.weight = view(layer.weight.data(), {n, layer.k});
  t.weight_scale = view(layer.weight_scale.data(), {n});
  t.deq_scale = view(layer.deq_scale.data(), {n});
  t.quant_bias = view(layer.quant_bias.data(), {n});
  const auto steps = static_cast<std::int64_t>(layer.input_scale.size());
  t.input_scale = view(layer.input_scale.data(), {steps});
  t.input_offset = view(layer.input_offset.data(), {steps});
  if (!layer.bias.empty()) t.bias = view(layer.bias.data(), {n});
  if (!layer.smooth.empty()) t.smooth_scale = view(layer.smooth.data(), {layer.k});
  // Now and then a tensor of the wrong length, rank or dtype.
  switch (in.size(0, 15)) {
    case 0:
      t.weight_scale.shape[0] = n + 1;
      break;
    case 1:
      t.weight.dtype = DType::u8;
      break;
    case 2:
      t.quant_bias.dtype = DType::f32;
      break;
    case 3:
      t.deq_scale = {};
      break;
    case 4:
      t.weight.rank = 1;
      break;
    default:
      break;
  }
  return t;
}

bool all_finite(const std::vector<float>& values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// y against `layer` (the layer's output in fp64 and the bound of its fp32 value) activated as
/// the call asked, but for the outputs `skip(i)` leaves to the caller.
template <class Y, class Skip>
void check_activated(const TestTensor<Y>& y, const test::EpilogueRef& layer, Activation activation,
                     const std::string& context, const Skip& skip) {
  const test::EpilogueRef ref = test::activated_ref(layer, activation, std::is_same_v<Y, bf16>);
  for (std::int64_t i = 0; i < y.size(); ++i) {
    if (skip(i)) continue;
    const double got = y.value(i), want = ref.expected[static_cast<std::size_t>(i)];
    const bool close =
        std::isnan(want)
            ? std::isnan(got)
            : got == want || std::fabs(got - want) <= ref.tolerance[static_cast<std::size_t>(i)];
    if (!close) {
      failure(context + ": y[" + std::to_string(i) + "] = " + std::to_string(got) +
              ", the reference " + std::to_string(want));
    }
  }
}

template <class X, class Y>
void run(Input& in) {
  std::mt19937 rng(in.seed());
  const QuantAlgo algo = in.pick({QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic,
                                  QuantAlgo::w8a8_timestep, QuantAlgo::float_linear});
  const std::int64_t n = in.size(1, 40);
  const std::int64_t k = in.rarely(4) ? in.size(1, 1100) : in.size(1, 70);
  const int steps = algo == QuantAlgo::w8a8_timestep ? static_cast<int>(in.size(1, 4)) : 1;
  Layer layer = make_layer(in, rng, n, k, steps);
  auto timestep = std::make_shared<Timestep>(
      TimestepPolicy().set(0, static_cast<int>(in.size(0, 4)), TimestepMode::static_params));
  std::vector<float> float_weight(layer.weight.begin(), layer.weight.end());
  QuantLinear linear(nullptr);
  const bool built = accepted([&] {
    if (algo == QuantAlgo::float_linear) {
      linear = QuantLinear::float_linear(
          view(float_weight.data(), {n, k}),
          layer.bias.empty() ? TensorView{} : view(layer.bias.data(), {n}));
    } else {
      linear = QuantLinear::w8a8(algo, tensors_of(layer, in),
                                 algo == QuantAlgo::w8a8_timestep ? timestep : nullptr);
    }
    if (in.rarely(4)) linear = QuantLinear::concat_outputs({linear});
  });
  if (!built) return;
  timestep->set_step(static_cast<int>(in.size(0, 5)));
  set_threads(in);

  std::vector<std::int64_t> x_shape, y_shape;
  const int leading = static_cast<int>(in.size(0, 2));
  for (int d = 0; d < leading; ++d) x_shape.push_back(in.size(0, 4));
  y_shape = x_shape;
  x_shape.push_back(k);
  y_shape.push_back(n);
  TestTensor<X> x(x_shape, in.size(0, 3));
  TestTensor<Y> y(y_shape, in.rarely(4) ? in.size(1, 3) : 0);
  const bool specials = in.rarely(8);
  fill(x, rng, specials);
  TensorView y_view = y.view();
  if (in.rarely(16)) y_view.shape[y_view.rank - 1] += 1;
  if (in.rarely(16)) y_view.strides[y_view.rank - 1] = 2;  // refused: the last dim is strided
  const Activation activation =
      in.pick({Activation::none, Activation::gelu_tanh, Activation::silu});
  const auto before = y.snapshot();
  if (!accepted([&] { linear.forward(x.view(), y_view, activation); })) {
    expect_unchanged(y, before, "y");
    return;
  }
  expect_canaries(y, "y");
  const std::int64_t m = x.size() / k;
  std::vector<float> x_values(static_cast<std::size_t>(x.size()));
  for (std::int64_t i = 0; i < x.size(); ++i)
    x_values[static_cast<std::size_t>(i)] = to_float(x.at(i));
  if (specials || !all_finite(layer.bias) || m == 0) return;  // propagated as the caller chose
  if (!layer.smooth.empty()) {
    // x · smooth_scale beyond fp32's range makes a dynamic row's scale inf (inf / inf quotients):
    // also the caller's choice, as special values are.
    for (std::int64_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x_values[static_cast<std::size_t>(i)] *
                         layer.smooth[static_cast<std::size_t>(i % k)])) {
        return;
      }
    }
  }
  const std::string context = std::string(quant_algo_name(algo)) + " m" + std::to_string(m) + " n" +
                              std::to_string(n) + " k" + std::to_string(k) + " activation " +
                              std::to_string(static_cast<int>(activation));
  if (algo == QuantAlgo::float_linear) {
    test::EpilogueRef layer_ref;
    layer_ref.expected = test::float_matmul_ref(x_values, float_weight, layer.bias, m, n, k);
    // fp32 sums of k products of N(0, 1) x and |w| <= 127 weights.
    const double atol = 127e-5 * std::sqrt(static_cast<double>(k));
    for (double want : layer_ref.expected)
      layer_ref.tolerance.push_back(atol + 1e-5 * std::fabs(want));
    // A result at the edge of fp32's range may round to inf in bf16: the caller's choice too.
    check_activated(y, layer_ref, activation, context, [&](std::int64_t i) {
      return !(std::fabs(layer_ref.expected[static_cast<std::size_t>(i)]) < 1e37);
    });
    return;
  }
  // The layer was accepted, so its parameters are finite (scales positive where they divide).
  test::RefQuant quant;
  std::vector<double> column_offset(static_cast<std::size_t>(n), 0.0), row_scale;
  std::vector<float> column_scale = layer.weight_scale;
  const int step = timestep->step();
  const bool static_step = algo == QuantAlgo::w8a8_static ||
                           (algo == QuantAlgo::w8a8_timestep && step < steps &&
                            timestep->policy().mode_at(step) == TimestepMode::static_params);
  quant.dynamic = !static_step;
  quant.smooth = layer.smooth.empty() ? nullptr : &layer.smooth;
  const auto t = static_cast<std::size_t>(algo == QuantAlgo::w8a8_timestep ? step : 0);
  if (static_step) {
    quant.scale = layer.input_scale[t];
    quant.offset = layer.input_offset[t];
  }
  std::vector<std::int32_t> q;
  test::quantize_ref(x_values, m, k, quant, q, row_scale);
  const auto acc = test::int_matmul_ref(q, layer.weight, m, n, k);
  if (algo == QuantAlgo::w8a8_static) {
    std::fill(row_scale.begin(), row_scale.end(), 1.0);
    column_scale = layer.deq_scale;
    for (std::int64_t j = 0; j < n; ++j)
      column_offset[static_cast<std::size_t>(j)] = layer.quant_bias[static_cast<std::size_t>(j)];
  } else if (static_step) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t i = 0; i < k; ++i) sum += layer.weight[static_cast<std::size_t>(j * k + i)];
      column_offset[static_cast<std::size_t>(j)] = -quant.offset * sum;
    }
  }
  const test::EpilogueRef layer_ref = test::epilogue_ref(
      acc, row_scale, column_scale, column_offset, layer.bias, m, n, /*bf16_output=*/false);
  check_activated(y, layer_ref, activation, context, [&](std::int64_t i) {
    // Scales whose fp32 product is subnormal (its relative precision is gone) or whose result
    // leaves fp32's range are the caller's choice, as for any fp32 computation.
    const double scales =
        row_scale[static_cast<std::size_t>(i / n)] * column_scale[static_cast<std::size_t>(i % n)];
    return (scales != 0 && std::fabs(scales) < FLT_MIN) ||
           !(std::fabs(layer_ref.expected[static_cast<std::size_t>(i)]) < 1e37);
  });
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  switch (in.size(0, 3)) {
    case 0:
      fuzz::run<float, float>(in);
      break;
    case 1:
      fuzz::run<bf16, float>(in);
      break;
    case 2:
      fuzz::run<float, bf16>(in);
      break;
    default:
      fuzz::run<bf16, bf16>(in);
      break;
  }
  return 0;
}
