// ditops-quantize's code path (loader::quantize_model) end to end: a random fp32 layer with
// realistic activations (N(0, 1) with a few outlier channels ~50x) quantized static and dynamic
// with SmoothQuant, written with msmodelslim's names, loaded by QuantModel, and run, against the
// fp32 result, both through QuantLinear and through the layer math of linear.hpp computed from
// the written tensors (tests/reference/linear_ref.hpp), which checks the files on their own.

#include "loader/quantize.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ditops/quant_model.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

#include "loader/quant_files.hpp"
#include "tests/loader/files.hpp"
#include "tests/reference/linear_ref.hpp"
#include "tests/support/temp_dir.hpp"

namespace ditops::test {
namespace {

using loader::SafetensorsEntry;
using loader::SafetensorsFile;

constexpr std::int64_t kIn = 96, kOut = 40, kCalibrationRows = 256, kRows = 24;
const std::vector<std::string> kLayers = {"blocks.0.attn.to_k", "blocks.0.attn.to_q",
                                          "blocks.0.attn.to_v", "blocks.0.ff"};

/// Activations [rows, kIn]: N(0, 1), channels 5, 17 and 60 scaled by ~50 (the outliers
/// SmoothQuant exists for).
std::vector<float> activations(std::int64_t rows, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(rows * kIn));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::int64_t k = static_cast<std::int64_t>(i) % kIn;
    x[i] = normal(rng) * (k == 5 || k == 17 ? 50.f : k == 60 ? 45.f : 1.f);
  }
  return x;
}

/// The fp32 model (weights, biases, an unrelated norm) and calibration inputs, in `dir`.
struct FloatModel {
  std::map<std::string, std::vector<float>> weight, bias;
  std::vector<float> norm = std::vector<float>(kIn, 1.f);
  std::string weights_path, calibration_path;

  FloatModel(const TempDir& dir, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.f, 0.05f);
    std::vector<SafetensorsEntry> model, calibration;
    std::map<std::string, std::vector<float>> inputs;
    for (const std::string& layer : kLayers) {
      auto& w = weight[layer];
      w.resize(static_cast<std::size_t>(kOut * kIn));
      for (float& value : w) value = normal(rng);
      auto& b = bias[layer];
      b.resize(static_cast<std::size_t>(kOut));
      for (float& value : b) value = normal(rng);
      inputs[layer] = activations(kCalibrationRows, rng);
    }
    for (const std::string& layer : kLayers) {
      model.push_back({layer + ".weight", "F32", {kOut, kIn}, view_bytes(weight[layer])});
      model.push_back({layer + ".bias", "F32", {kOut}, view_bytes(bias[layer])});
    }
    model.push_back({"blocks.0.norm.weight", "F32", {kIn}, view_bytes(norm)});
    weights_path = dir / "model.safetensors";
    loader::write_safetensors(weights_path, model);
    for (auto& [layer, x] : inputs) {
      calibration.push_back({layer + ".input", "F32", {kCalibrationRows, kIn}, view_bytes(x)});
    }
    calibration_path = dir / "calibration.safetensors";
    loader::write_safetensors(calibration_path, calibration);
  }

  static std::string_view view_bytes(const std::vector<float>& values) {
    return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)};
  }

  /// y = x · Wᵀ + b in double, [rows, kOut].
  std::vector<double> reference(const std::string& layer, const std::vector<float>& x) const {
    return float_matmul_ref(x, weight.at(layer), bias.at(layer),
                            static_cast<std::int64_t>(x.size()) / kIn, kOut, kIn);
  }
};

template <class A, class B>
double cosine(const std::vector<A>& a, const std::vector<B>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += double{a[i]} * double{b[i]};
    aa += double{a[i]} * double{a[i]};
    bb += double{b[i]} * double{b[i]};
  }
  return dot / std::sqrt(aa * bb);
}

std::vector<float> floats(const SafetensorsFile& file, const std::string& name) {
  return file.get(name).to_floats(file.path());
}

/// The layer of linear.hpp computed from the written tensors (as QuantLinear must compute it).
/// A smoothed layer has its factors at `<name>.div.mul_scale`, its tensors at `<name>.linear.*`.
std::vector<double> emulate(const SafetensorsFile& file, const std::string& name, QuantAlgo algo,
                            const std::vector<float>& x) {
  std::vector<float> smooth;
  RefQuant quant;
  std::string layer = name;
  if (const auto* smooth_tensor = file.find(name + ".div.mul_scale")) {
    smooth = smooth_tensor->to_floats(file.path());
    quant.smooth = &smooth;
    layer += ".linear";
  }
  const auto& weight_tensor = file.get(layer + ".weight");
  const auto* weight_data = reinterpret_cast<const std::int8_t*>(weight_tensor.data);
  const std::vector<std::int8_t> weight(weight_data, weight_data + weight_tensor.bytes);
  quant.dynamic = algo == QuantAlgo::w8a8_dynamic;
  if (!quant.dynamic) {
    quant.scale = floats(file, layer + ".input_scale")[0];
    quant.offset = floats(file, layer + ".input_offset")[0];
  }
  const auto rows = static_cast<std::int64_t>(x.size()) / kIn;
  std::vector<std::int32_t> q;
  std::vector<double> row_scale;
  quantize_ref(x, rows, kIn, quant, q, row_scale);
  const std::vector<std::int64_t> acc = int_matmul_ref(q, weight, rows, kOut, kIn);

  std::vector<float> column_scale(kOut);
  std::vector<double> column_offset(kOut, 0.0);
  for (std::int64_t n = 0; n < kOut; ++n) {
    const auto at = static_cast<std::size_t>(n);
    if (quant.dynamic) {
      column_scale[at] = floats(file, layer + ".weight_scale")[at];
    } else {
      // deq_scale = input_scale · weight_scale as fp32 bits in an int64, so the row scale is 1.
      std::int64_t bits;
      std::memcpy(&bits, file.get(layer + ".deq_scale").data + n * 8, sizeof bits);
      const auto low = static_cast<std::uint32_t>(bits);
      std::memcpy(&column_scale[at], &low, sizeof(float));
      std::int32_t quant_bias;
      std::memcpy(&quant_bias, file.get(layer + ".quant_bias").data + n * 4, sizeof quant_bias);
      column_offset[at] = quant_bias;
      row_scale.assign(row_scale.size(), 1.0);
    }
  }
  return epilogue_ref(acc, row_scale, column_scale, column_offset, floats(file, layer + ".bias"),
                      rows, kOut, /*bf16_output=*/false)
      .expected;
}

struct Quantized {
  TempDir dir{"ditops_quantize"};
  std::mt19937 rng{2024};
  FloatModel fp32{dir, rng};
  loader::QuantizeReport report;
  std::vector<float> x = activations(kRows, rng);  // inputs the calibration never saw

  explicit Quantized(QuantAlgo algo, std::optional<float> smooth = 0.5f,
                     std::vector<std::string> float_patterns = {}) {
    loader::QuantizeOptions options;
    options.algo = algo;
    options.smooth_alpha = smooth;
    options.float_patterns = std::move(float_patterns);
    const SafetensorsFile weights = SafetensorsFile::open(fp32.weights_path);
    const SafetensorsFile calibration = SafetensorsFile::open(fp32.calibration_path);
    report = loader::quantize_model(weights, &calibration, dir.path(), options);
  }
};

TEST(Quantize, WritesMsmodelslimNamesDtypesAndShapes) {
  const Quantized q(QuantAlgo::w8a8_static, 0.5f, {"*.ff"});
  EXPECT_EQ(q.report.description_path, q.dir / "quant_model_description_w8a8.json");
  EXPECT_EQ(q.report.weights_path, q.dir / "quant_model_weight_w8a8.safetensors");
  EXPECT_EQ(q.report.float_layers, std::vector<std::string>{"blocks.0.ff"});
  EXPECT_EQ(q.report.quantized_layers.size(), 3u);

  const SafetensorsFile file = SafetensorsFile::open(q.report.weights_path);
  // msmodelslim's names for a smoothed layer: the factors at `<name>.div.mul_scale` (FLOAT),
  // the layer's own tensors at `<name>.linear.*`.
  const std::string to_q = "blocks.0.attn.to_q";
  const std::map<std::string, std::pair<std::string, std::vector<std::int64_t>>> expected = {
      {".linear.weight", {"I8", {kOut, kIn}}}, {".linear.deq_scale", {"I64", {kOut}}},
      {".linear.quant_bias", {"I32", {kOut}}}, {".linear.input_scale", {"F32", {1}}},
      {".linear.input_offset", {"F32", {1}}},  {".linear.bias", {"F32", {kOut}}},
      {".div.mul_scale", {"F32", {kIn}}},
  };
  std::ifstream description_file(q.report.description_path);
  const nlohmann::json description = nlohmann::json::parse(description_file);
  EXPECT_EQ(description["model_quant_type"], "W8A8");
  for (const auto& [suffix, dtype_shape] : expected) {
    const auto& tensor = file.get(to_q + suffix);
    EXPECT_EQ(tensor.dtype, dtype_shape.first) << suffix;
    EXPECT_EQ(tensor.shape, dtype_shape.second) << suffix;
    EXPECT_EQ(description[to_q + suffix], suffix == ".div.mul_scale" ? "FLOAT" : "W8A8") << suffix;
  }
  EXPECT_EQ(file.find(to_q + ".weight"), nullptr);
  EXPECT_EQ(file.find(to_q + ".linear.div.mul_scale"), nullptr);
  // Weights in [-127, 127]; each row reaches 127 in magnitude (per-channel max scaling).
  const auto* w = reinterpret_cast<const std::int8_t*>(file.get(to_q + ".linear.weight").data);
  for (std::int64_t n = 0; n < kOut; ++n) {
    int max = 0;
    for (std::int64_t k = 0; k < kIn; ++k) {
      EXPECT_GE(w[n * kIn + k], -127);
      max = std::max(max, std::abs(int{w[n * kIn + k]}));
    }
    EXPECT_EQ(max, 127);
  }
  // The FLOAT layer and the norm are copied bit for bit.
  EXPECT_EQ(description["blocks.0.ff.weight"], "FLOAT");
  EXPECT_EQ(description["blocks.0.norm.weight"], "FLOAT");
  EXPECT_EQ(floats(file, "blocks.0.ff.weight"), q.fp32.weight.at("blocks.0.ff"));
  EXPECT_EQ(floats(file, "blocks.0.norm.weight"), q.fp32.norm);

  const QuantModel model = QuantModel::load(q.report.description_path);
  EXPECT_EQ(model.layer_names(),
            (std::vector<std::string>{"blocks.0.attn.to_k", "blocks.0.attn.to_q",
                                      "blocks.0.attn.to_v", "blocks.0.ff", "blocks.0.norm"}));
  EXPECT_EQ(model.layer_algo(to_q), QuantAlgo::w8a8_static);
  EXPECT_EQ(model.layer_algo("blocks.0.ff"), QuantAlgo::float_linear);
}

TEST(Quantize, WrittenLayersMatchFp32ByTheLayerMath) {
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const Quantized smoothed(algo, 0.5f), plain(algo, std::nullopt);
    const SafetensorsFile smoothed_file = SafetensorsFile::open(smoothed.report.weights_path);
    const SafetensorsFile plain_file = SafetensorsFile::open(plain.report.weights_path);
    for (const std::string& layer : kLayers) {
      const auto& x = smoothed.x;  // the same seed: the same model and inputs in both
      const std::vector<double> reference = smoothed.fp32.reference(layer, x);
      const double with_smoothing = cosine(emulate(smoothed_file, layer, algo, x), reference);
      const double without = cosine(emulate(plain_file, layer, algo, x), reference);
      EXPECT_GE(with_smoothing, 0.999) << layer;
      EXPECT_GE(without, 0.99) << layer;
      // The outlier channels widen the static per-tensor range: smoothing must cut the error.
      if (algo == QuantAlgo::w8a8_static) {
        EXPECT_LT(1 - with_smoothing, (1 - without) / 5) << layer;
      }
    }
  }
}

TEST(Quantize, RefusesStaticWithoutCalibration) {
  const TempDir dir("ditops_quantize");
  std::mt19937 rng(3);
  const FloatModel fp32(dir, rng);
  const SafetensorsFile weights = SafetensorsFile::open(fp32.weights_path);
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    loader::QuantizeOptions options;
    options.algo = algo;
    if (algo == QuantAlgo::w8a8_dynamic) options.smooth_alpha = 0.5f;
    try {
      loader::quantize_model(weights, nullptr, dir.path(), options);
      ADD_FAILURE();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("needs a calibration file"), std::string::npos)
          << error.what();
    }
  }
  loader::QuantizeOptions dynamic;
  dynamic.algo = QuantAlgo::w8a8_dynamic;
  EXPECT_NO_THROW(loader::quantize_model(weights, nullptr, dir.path(), dynamic));
}

TEST(Quantize, RefusesNonFiniteWeights) {
  const TempDir dir("ditops_quantize");
  std::vector<float> weight(6, 0.5f);
  weight[4] = std::nanf("");
  loader::write_safetensors(dir / "model.safetensors",
                            {{"l.weight", "F32", {2, 3}, FloatModel::view_bytes(weight)}});
  loader::QuantizeOptions options;
  options.algo = QuantAlgo::w8a8_dynamic;
  try {
    loader::quantize_model(SafetensorsFile::open(dir / "model.safetensors"), nullptr, dir.path(),
                           options);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor \"l.weight\" element [1, 1] is not finite"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"});  // nothing written
}

std::vector<float> forward(const QuantLinear& layer, const std::vector<float>& x) {
  const auto rows = static_cast<std::int64_t>(x.size()) / layer.in_features();
  std::vector<float> y(static_cast<std::size_t>(rows * layer.out_features()));
  layer.forward(view(x.data(), {rows, layer.in_features()}),
                view(y.data(), {rows, layer.out_features()}));
  return y;
}

TEST(Quantize, LoadedLayersMatchFp32) {
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const Quantized q(algo, 0.5f, {"*.ff"});
    const QuantModel model = QuantModel::load(q.report.description_path);
    for (const std::string& layer : kLayers) {
      const QuantLinear linear = model.linear(layer);
      EXPECT_EQ(linear.algo(), layer == "blocks.0.ff" ? QuantAlgo::float_linear : algo);
      EXPECT_EQ(linear.in_features(), kIn);
      EXPECT_EQ(linear.out_features(), kOut);
      EXPECT_GE(cosine(forward(linear, q.x), q.fp32.reference(layer, q.x)), 0.999) << layer;
    }
  }
}

TEST(Quantize, FusedQkvEqualsTheThreeLayers) {
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    SCOPED_TRACE(quant_algo_name(algo));
    // Static fusion needs one input_scale / input_offset: calibrate Q, K and V on one input,
    // without SmoothQuant (its factors are per layer, so they would differ).
    const TempDir dir("ditops_quantize");
    std::mt19937 rng(7);
    const FloatModel fp32(dir, rng);
    const std::vector<float> shared = activations(kCalibrationRows, rng);
    std::vector<SafetensorsEntry> calibration;
    for (const std::string& layer : kLayers) {
      calibration.push_back(
          {layer + ".input", "F32", {kCalibrationRows, kIn}, FloatModel::view_bytes(shared)});
    }
    loader::write_safetensors(dir / "shared.safetensors", calibration);
    loader::QuantizeOptions options;
    options.algo = algo;
    const SafetensorsFile weights = SafetensorsFile::open(fp32.weights_path);
    const SafetensorsFile inputs = SafetensorsFile::open(dir / "shared.safetensors");
    const auto report = loader::quantize_model(weights, &inputs, dir.path(), options);
    const QuantModel model = QuantModel::load(report.description_path);

    const std::vector<float> x = activations(kRows, rng);
    const QuantLinear fused =
        model.fused_qkv("blocks.0.attn.to_q", "blocks.0.attn.to_k", "blocks.0.attn.to_v");
    ASSERT_EQ(fused.out_features(), 3 * kOut);
    const std::vector<float> y = forward(fused, x);
    std::int64_t part = 0;
    for (const char* name : {"blocks.0.attn.to_q", "blocks.0.attn.to_k", "blocks.0.attn.to_v"}) {
      const std::vector<float> alone = forward(model.linear(name), x);
      for (std::int64_t r = 0; r < kRows; ++r) {
        EXPECT_EQ(std::memcmp(&y[static_cast<std::size_t>(r * 3 * kOut + part * kOut)],
                              &alone[static_cast<std::size_t>(r * kOut)], kOut * sizeof(float)),
                  0)
            << name << " row " << r;
      }
      ++part;
    }
  }
}

}  // namespace
}  // namespace ditops::test
