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
/// A W8A8_TIMESTEP layer is emulated at denoising step `step` with that step's static parameters.
std::vector<double> emulate(const SafetensorsFile& file, const std::string& name, QuantAlgo algo,
                            const std::vector<float>& x, std::size_t step = 0) {
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
    quant.scale = floats(file, layer + ".input_scale").at(step);
    quant.offset = floats(file, layer + ".input_offset").at(step);
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
    } else if (algo == QuantAlgo::w8a8_timestep) {
      // x · Wᵀ ≈ scale · weight_scale · (x_q - offset) · W_qᵀ
      column_scale[at] = floats(file, layer + ".weight_scale")[at];
      std::int64_t row_sum = 0;
      for (std::int64_t k = 0; k < kIn; ++k)
        row_sum += weight[static_cast<std::size_t>(n * kIn + k)];
      column_offset[at] = -static_cast<double>(quant.offset) * static_cast<double>(row_sum);
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
  QuantizeReport report;
  std::vector<float> x = activations(kRows, rng);  // inputs the calibration never saw

  explicit Quantized(QuantAlgo algo, std::optional<float> smooth = 0.5f,
                     std::vector<std::string> float_patterns = {}) {
    QuantizeOptions options;
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
    QuantizeOptions options;
    options.algo = algo;
    if (algo == QuantAlgo::w8a8_dynamic) options.smooth_alpha = 0.5f;
    try {
      loader::quantize_model(weights, nullptr, dir.path(), options);
      ADD_FAILURE();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("needs calibration"), std::string::npos)
          << error.what();
    }
  }
  QuantizeOptions dynamic;
  dynamic.algo = QuantAlgo::w8a8_dynamic;
  EXPECT_NO_THROW(loader::quantize_model(weights, nullptr, dir.path(), dynamic));
}

TEST(Quantize, RefusesNonFiniteWeights) {
  const TempDir dir("ditops_quantize");
  std::vector<float> weight(6, 0.5f);
  weight[4] = std::nanf("");
  loader::write_safetensors(dir / "model.safetensors",
                            {{"l.weight", "F32", {2, 3}, FloatModel::view_bytes(weight)}});
  QuantizeOptions options;
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
    QuantizeOptions options;
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

/// Each channel's maximum, then its minimum, over the rows of `x` [rows, kIn]: [2, kIn].
std::vector<float> channel_ranges(const std::vector<float>& x) {
  std::vector<float> ranges(2 * kIn);
  for (std::int64_t k = 0; k < kIn; ++k) {
    ranges[static_cast<std::size_t>(k)] = -INFINITY;
    ranges[static_cast<std::size_t>(kIn + k)] = INFINITY;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t k = i % kIn;
    ranges[k] = std::max(ranges[k], x[i]);
    ranges[kIn + k] = std::min(ranges[kIn + k], x[i]);
  }
  return ranges;
}

/// Every tensor of two files has the same dtype, shape and bytes.
void expect_same_tensors(const SafetensorsFile& a, const SafetensorsFile& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    const auto &x = a.get(name), &y = b.get(name);
    EXPECT_EQ(x.dtype, y.dtype) << name;
    EXPECT_EQ(x.shape, y.shape) << name;
    ASSERT_EQ(x.bytes, y.bytes) << name;
    EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<std::size_t>(x.bytes)), 0) << name;
  }
}

TEST(Quantize, RecordedRangesGiveTheExportOfTheInputs) {
  // A calibration run keeps per-channel ranges, not activations: [2, in] and [1, 2, in] must
  // write what the activations themselves write (SmoothQuant and the static range included).
  for (const QuantAlgo algo : {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const Quantized from_inputs(algo, 0.5f);
    const SafetensorsFile inputs = SafetensorsFile::open(from_inputs.fp32.calibration_path);
    for (const bool with_step_axis : {false, true}) {
      const TempDir dir("ditops_quantize");
      std::map<std::string, std::vector<float>> ranges;
      std::vector<SafetensorsEntry> entries;
      for (const std::string& layer : kLayers) {
        ranges[layer] = channel_ranges(floats(inputs, layer + ".input"));
        std::vector<std::int64_t> shape = {2, kIn};
        if (with_step_axis) shape.insert(shape.begin(), 1);
        entries.push_back(
            {layer + ".input_range", "F32", shape, FloatModel::view_bytes(ranges[layer])});
      }
      loader::write_safetensors(dir / "ranges.safetensors", entries);
      QuantizeOptions options;
      options.algo = algo;
      options.smooth_alpha = 0.5f;
      const SafetensorsFile range_file = SafetensorsFile::open(dir / "ranges.safetensors");
      const auto report = loader::quantize_model(
          SafetensorsFile::open(from_inputs.fp32.weights_path), &range_file, dir.path(), options);
      expect_same_tensors(SafetensorsFile::open(report.weights_path),
                          SafetensorsFile::open(from_inputs.report.weights_path));
    }
  }
}

TEST(Quantize, TimestepExportHoldsEachStepsStaticParameters) {
  // Three denoising steps whose activations differ in scale (x1, x4, x20): each step gets the
  // parameters of its own range, the loaded layer runs step t's, and another step's would
  // clip (the check that the step is the one read).
  const TempDir dir("ditops_quantize");
  std::mt19937 rng(11);
  const FloatModel fp32(dir, rng);
  constexpr float kStepScale[] = {1.f, 4.f, 20.f};
  std::map<std::string, std::vector<float>> ranges;
  std::vector<SafetensorsEntry> entries;
  for (const std::string& layer : kLayers) {
    for (const float scale : kStepScale) {
      std::vector<float> x = activations(kCalibrationRows, rng);
      for (float& value : x) value *= scale;
      const std::vector<float> step = channel_ranges(x);
      ranges[layer].insert(ranges[layer].end(), step.begin(), step.end());
    }
    entries.push_back(
        {layer + ".input_range", "F32", {3, 2, kIn}, FloatModel::view_bytes(ranges[layer])});
  }
  loader::write_safetensors(dir / "ranges.safetensors", entries);
  const SafetensorsFile range_file = SafetensorsFile::open(dir / "ranges.safetensors");
  QuantizeOptions options;
  options.algo = QuantAlgo::w8a8_timestep;
  options.float_patterns = {"*.ff"};
  const auto report = loader::quantize_model(SafetensorsFile::open(fp32.weights_path), &range_file,
                                             dir.path(), options);
  EXPECT_EQ(report.description_path, dir / "quant_model_description_w8a8_timestep.json");
  const SafetensorsFile file = SafetensorsFile::open(report.weights_path);

  const std::string to_q = "blocks.0.attn.to_q";
  EXPECT_EQ(file.get(to_q + ".input_scale").shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(file.get(to_q + ".input_offset").shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(floats(file, to_q + ".weight_offset"), std::vector<float>(kOut, 0.f));
  EXPECT_EQ(file.find(to_q + ".deq_scale"), nullptr);
  const std::vector<float> scales = floats(file, to_q + ".input_scale");
  const std::vector<float> offsets = floats(file, to_q + ".input_offset");
  for (std::size_t t = 0; t < 3; ++t) {
    // The range holds 0; computed here in double from the recorded ranges.
    double max = 0, min = 0;
    for (std::int64_t k = 0; k < kIn; ++k) {
      max = std::max(max, double{ranges[to_q][t * 2 * kIn + k]});
      min = std::min(min, double{ranges[to_q][t * 2 * kIn + kIn + k]});
    }
    const double scale = (max - min) / 255;
    EXPECT_NEAR(scales[t], scale, 1e-6 * scale) << "step " << t;
    EXPECT_EQ(offsets[t], std::clamp(std::nearbyint(-128 - min / scale), -128.0, 127.0))
        << "step " << t;
  }

  QuantModelOptions load_options;
  load_options.timestep_policy.set(0, 2, TimestepMode::static_params);
  QuantModel model = QuantModel::load(report.description_path, load_options);
  EXPECT_EQ(model.layer_algo(to_q), QuantAlgo::w8a8_timestep);
  std::vector<float> x = activations(kRows, rng);
  for (float& value : x) value *= kStepScale[2];
  model.set_timestep_step(2);
  const std::vector<float> y = forward(model.linear(to_q), x);
  const std::vector<double> reference = fp32.reference(to_q, x);
  // Per-tensor static without SmoothQuant: the outlier channels stretch the range (about
  // 0.999, as in WrittenLayersMatchFp32ByTheLayerMath's unsmoothed layers).
  EXPECT_GE(cosine(y, reference), 0.998);
  EXPECT_GE(cosine(y, emulate(file, to_q, QuantAlgo::w8a8_timestep, x, 2)), 0.999999);
  EXPECT_LT(cosine(emulate(file, to_q, QuantAlgo::w8a8_timestep, x, 0), reference), 0.99);
}

TEST(Quantize, RefusesBadRanges) {
  const TempDir dir("ditops_quantize");
  std::mt19937 rng(5);
  const FloatModel fp32(dir, rng);
  const SafetensorsFile weights = SafetensorsFile::open(fp32.weights_path);
  const SafetensorsFile inputs = SafetensorsFile::open(fp32.calibration_path);
  const std::string layer = kLayers[0];
  const std::vector<float> good = channel_ranges(floats(inputs, layer + ".input"));
  std::vector<float> swapped = good, infinite = good;
  std::swap(swapped[3], swapped[kIn + 3]);
  infinite[kIn] = -INFINITY;
  const std::vector<float> input = floats(inputs, layer + ".input");
  struct Case {
    std::vector<std::int64_t> shape;   ///< of `<layer>.input_range`, the first values of `values`
    const std::vector<float>* values;  ///< null: the layer has no calibration tensor
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{2, kIn - 1}, &good, "expected [2, 96] or [steps, 2, 96]"},
      {{3, kIn}, &input, "expected [2, 96] or [steps, 2, 96]"},
      {{2, kIn}, &swapped, "step 0 channel 3 has its minimum above its maximum"},
      {{2, kIn}, &infinite, "holds a non-finite value"},
      {{}, nullptr, "has neither \"" + layer + ".input\" [rows, 96] nor"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.expected);
    const TempDir out("ditops_quantize");
    std::vector<SafetensorsEntry> entries;
    for (const std::string& other : kLayers) {
      if (other == layer) continue;
      const auto& tensor = inputs.get(other + ".input");
      entries.push_back(
          {tensor.name,
           "F32",
           tensor.shape,
           {reinterpret_cast<const char*>(tensor.data), static_cast<std::size_t>(tensor.bytes)}});
    }
    if (bad.values) {
      std::int64_t count = 1;
      for (const std::int64_t extent : bad.shape) count *= extent;
      entries.push_back({layer + ".input_range", "F32", bad.shape,
                         FloatModel::view_bytes(*bad.values).substr(0, 4 * count)});
    }
    loader::write_safetensors(out / "calibration.safetensors", entries);
    const SafetensorsFile calibration = SafetensorsFile::open(out / "calibration.safetensors");
    QuantizeOptions options;
    options.algo = QuantAlgo::w8a8_timestep;
    try {
      loader::quantize_model(weights, &calibration, out.path(), options);
      ADD_FAILURE();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(bad.expected), std::string::npos) << error.what();
    }
    EXPECT_EQ(out.names(), std::vector<std::string>{"calibration.safetensors"});
  }
}

TEST(QuantizeExport, InMemoryTensorsWriteTheFilesExport) {
  const Quantized from_files(QuantAlgo::w8a8_static, 0.5f, {"*.ff"});
  const SafetensorsFile inputs = SafetensorsFile::open(from_files.fp32.calibration_path);
  std::vector<NamedTensor> weights, calibration;
  for (const std::string& layer : kLayers) {
    weights.push_back(
        {layer + ".weight",
         view(const_cast<float*>(from_files.fp32.weight.at(layer).data()), {kOut, kIn})});
    weights.push_back(
        {layer + ".bias", view(const_cast<float*>(from_files.fp32.bias.at(layer).data()), {kOut})});
    calibration.push_back({layer + ".input", inputs.get(layer + ".input").view(inputs.path())});
  }
  std::vector<float> norm = from_files.fp32.norm;
  weights.push_back({"blocks.0.norm.weight", view(norm.data(), {kIn})});
  const TempDir dir("ditops_quantize");
  QuantizeOptions options;
  options.algo = QuantAlgo::w8a8_static;
  options.smooth_alpha = 0.5f;
  options.float_patterns = {"*.ff"};
  const QuantizeReport report = quantize_export(weights, calibration, dir.path(), options);
  EXPECT_EQ(report.quantized_layers, from_files.report.quantized_layers);
  EXPECT_EQ(report.float_layers, from_files.report.float_layers);
  expect_same_tensors(SafetensorsFile::open(report.weights_path),
                      SafetensorsFile::open(from_files.report.weights_path));

  // A view that is not row-major (every other column block) is refused, naming the call and
  // the tensor; nothing written.
  const TempDir empty("ditops_quantize");
  std::vector<NamedTensor> strided = weights;
  strided[0].tensor = view(const_cast<float*>(from_files.fp32.weight.at(kLayers[0]).data()),
                           {kOut / 2, kIn}, {2 * kIn, 1});
  try {
    quantize_export(strided, calibration, empty.path(), options);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("quantize_export"), std::string::npos);
    EXPECT_NE(std::string(error.what())
                  .find(kLayers[0] + ".weight\" of shape [20, 96] is not "
                                     "contiguous"),
              std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(empty.names().empty());
}

}  // namespace
}  // namespace ditops::test
