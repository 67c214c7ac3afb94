#include "loader/quantize.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "loader/quant_files.hpp"
#include "ops/core/check.hpp"
#include "ops/core/file.hpp"
#include "ops/core/scratch.hpp"

namespace ditops::loader {
namespace {

constexpr const char* kCall = "quantize_model";
constexpr std::string_view kCalibrationInput = ".input";
constexpr std::string_view kCalibrationRange = ".input_range";

/// The bytes of `values` as one tensor's data.
template <class T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

/// The tensors written for the layers, and the description's keys.
struct Output {
  std::vector<std::string> names, dtypes, data;
  std::vector<std::vector<std::int64_t>> shapes;
  nlohmann::json description = nlohmann::json::object();

  void add(const std::string& name, const char* dtype, std::vector<std::int64_t> shape,
           std::string bytes, QuantAlgo algo) {
    names.push_back(name);
    dtypes.emplace_back(dtype);
    shapes.push_back(std::move(shape));
    data.push_back(std::move(bytes));
    description[name] = quant_algo_name(algo);
  }
};

struct Layer {
  std::string name;
  const SafetensorsTensor* weight;
  const SafetensorsTensor* bias;  ///< or null
  std::int64_t out, in;
};

bool keep_float(const std::string& layer, const QuantizeOptions& options) {
  return std::any_of(options.float_patterns.begin(), options.float_patterns.end(),
                     [&](const std::string& pattern) {
                       return ::fnmatch(pattern.c_str(), layer.c_str(), 0) == 0;
                     });
}

/// A layer's calibration: for each denoising step, each input channel's largest and smallest
/// value ([steps, in] each, row-major).
struct InputRanges {
  std::int64_t steps = 0;
  std::vector<float> max, min;
};

/// The layer's ranges from its inputs `<layer>.input` [rows, in] (one step) or from the ranges
/// a calibration run recorded, `<layer>.input_range` [2, in] or [steps, 2, in] (each channel's
/// maximum, then its minimum).
InputRanges input_ranges(const SafetensorsFile& calibration, const Layer& layer) {
  const std::string input_name = layer.name + std::string(kCalibrationInput);
  const std::string range_name = layer.name + std::string(kCalibrationRange);
  const auto fail = [&](const std::string& tensor, const std::string& problem) {
    throw Error(std::string(kCall) + ": calibration " + calibration.path() + ": tensor \"" +
                tensor + "\" " + problem);
  };
  const SafetensorsTensor* input = calibration.find(input_name);
  const SafetensorsTensor* range = calibration.find(range_name);
  if (input && range) fail(range_name, "is given beside \"" + input_name + "\": give one");
  if (!input && !range) {
    throw Error(std::string(kCall) + ": calibration " + calibration.path() + " has neither \"" +
                input_name + "\" [rows, " + std::to_string(layer.in) + "] nor \"" + range_name +
                "\" [steps, 2, " + std::to_string(layer.in) + "]");
  }
  const auto in = static_cast<std::size_t>(layer.in);
  InputRanges ranges;
  if (input) {
    if (input->shape.empty() || input->shape.back() != layer.in || input->numel() == 0) {
      fail(input_name, "has shape " + input->shape_string() + ", expected [rows, " +
                           std::to_string(layer.in) + "] with rows > 0");
    }
    const std::vector<float> x = input->to_floats(calibration.path());
    ranges.steps = 1;
    ranges.max.assign(in, -std::numeric_limits<float>::infinity());
    ranges.min.assign(in, std::numeric_limits<float>::infinity());
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) fail(input_name, "holds a non-finite value");
      ranges.max[i % in] = std::max(ranges.max[i % in], x[i]);
      ranges.min[i % in] = std::min(ranges.min[i % in], x[i]);
    }
    return ranges;
  }
  const std::vector<std::int64_t>& shape = range->shape;
  const bool one_step = shape == std::vector<std::int64_t>{2, layer.in};
  if (!one_step && !(shape.size() == 3 && shape[0] > 0 && shape[1] == 2 && shape[2] == layer.in)) {
    fail(range_name, "has shape " + range->shape_string() + ", expected [2, " +
                         std::to_string(layer.in) + "] or [steps, 2, " + std::to_string(layer.in) +
                         "] (each channel's maximum, then minimum)");
  }
  const std::vector<float> values = range->to_floats(calibration.path());
  ranges.steps = one_step ? 1 : shape[0];
  for (std::int64_t t = 0; t < ranges.steps; ++t) {
    const auto step_max = values.begin() + static_cast<std::ptrdiff_t>(2 * in * t);
    ranges.max.insert(ranges.max.end(), step_max, step_max + static_cast<std::ptrdiff_t>(in));
    ranges.min.insert(ranges.min.end(), step_max + static_cast<std::ptrdiff_t>(in),
                      step_max + static_cast<std::ptrdiff_t>(2 * in));
  }
  for (std::size_t i = 0; i < ranges.max.size(); ++i) {
    if (!std::isfinite(ranges.max[i]) || !std::isfinite(ranges.min[i])) {
      fail(range_name, "holds a non-finite value");
    }
    if (ranges.min[i] > ranges.max[i]) {
      fail(range_name, "step " + std::to_string(i / in) + " channel " + std::to_string(i % in) +
                           " has its minimum above its maximum");
    }
  }
  return ranges;
}

/// SmoothQuant's per-input-channel factors s (W' = W * s, x' = x / s).
std::vector<float> smooth_factors(const std::vector<float>& weight, const InputRanges& x,
                                  const Layer& layer, float alpha) {
  std::vector<float> x_max(static_cast<std::size_t>(layer.in), 0.f);
  std::vector<float> w_max(static_cast<std::size_t>(layer.in), 0.f);
  for (std::size_t i = 0; i < x.max.size(); ++i) {
    float& max = x_max[i % x_max.size()];
    max = std::max({max, std::fabs(x.max[i]), std::fabs(x.min[i])});
  }
  for (std::size_t i = 0; i < weight.size(); ++i) {
    float& max = w_max[i % w_max.size()];
    max = std::max(max, std::fabs(weight[i]));
  }
  std::vector<float> factors(x_max.size());
  for (std::size_t k = 0; k < factors.size(); ++k) {
    const double s = std::pow(double{x_max[k]}, alpha) / std::pow(double{w_max[k]}, 1.0 - alpha);
    // A channel that is zero in the weights or the inputs has nothing to migrate.
    factors[k] = std::isfinite(s) && s > 0 ? static_cast<float>(s) : 1.f;
  }
  return factors;
}

/// Static activation parameters of one per-tensor range.
struct ActivationParams {
  float scale, offset;
};

/// The parameters of steps [first, last) of `x`, for a layer that quantizes x · mul_scale
/// (mul_scale > 0, so each channel's extremes scale with it): the range widened to hold 0, as
/// PyTorch's observers make it, so zero inputs (padding) stay exact.
ActivationParams activation_params(const InputRanges& x, std::int64_t first, std::int64_t last,
                                   const std::vector<float>& mul_scale) {
  const std::size_t in = mul_scale.size();
  float min = 0.f, max = 0.f;
  for (std::size_t i = static_cast<std::size_t>(first) * in;
       i < static_cast<std::size_t>(last) * in; ++i) {
    min = std::min(min, x.min[i] * mul_scale[i % in]);
    max = std::max(max, x.max[i] * mul_scale[i % in]);
  }
  const float scale = max > min ? (max - min) / 255.f : 1.f;
  return {scale, std::clamp(std::nearbyint(-128.f - min / scale), -128.f, 127.f)};
}

void quantize_layer(const Layer& layer, const SafetensorsFile& weights,
                    const SafetensorsFile* calibration, const QuantizeOptions& options,
                    Output& output) {
  const auto rows = static_cast<std::size_t>(layer.out);
  const auto cols = static_cast<std::size_t>(layer.in);
  std::vector<float> weight = layer.weight->to_floats(weights.path());
  InputRanges input;
  const bool needs_input = options.algo != QuantAlgo::w8a8_dynamic || options.smooth_alpha;
  if (needs_input) input = input_ranges(*calibration, layer);
  std::vector<float> mul_scale(cols, 1.f);  // what the layer multiplies x by before quantizing

  // msmodelslim's layout of a smoothed layer: the factors as `name.div.mul_scale` (FLOAT), the
  // layer's tensors under `name.linear`.
  std::string prefix = layer.name;
  if (options.smooth_alpha) {
    const std::vector<float> factors = smooth_factors(weight, input, layer, *options.smooth_alpha);
    for (std::size_t k = 0; k < cols; ++k) mul_scale[k] = 1.f / factors[k];
    for (std::size_t i = 0; i < weight.size(); ++i) weight[i] *= factors[i % cols];
    output.add(layer.name + std::string(kSmoothScale), "F32", {layer.in}, bytes_of(mul_scale),
               QuantAlgo::float_linear);
    prefix += kSmoothedLinear;
  }

  std::vector<float> weight_scale(rows);
  std::vector<std::int8_t> weight_q(weight.size());
  std::vector<std::int64_t> row_sums(rows, 0);
  for (std::size_t n = 0; n < rows; ++n) {
    const float* row = weight.data() + n * cols;
    float max = 0.f;
    for (std::size_t k = 0; k < cols; ++k) {
      if (!std::isfinite(row[k])) {
        throw Error(std::string(kCall) + ": " + weights.path() + ": tensor \"" +
                    layer.weight->name + "\" element [" + std::to_string(n) + ", " +
                    std::to_string(k) + "] is not finite" +
                    (options.smooth_alpha ? " (after SmoothQuant's scaling)" : ""));
      }
      max = std::max(max, std::fabs(row[k]));
    }
    // An all-zero row quantizes to zeros with any scale; the layer wants scales > 0.
    weight_scale[n] = max > 0.f ? max / 127.f : 1.f;
    for (std::size_t k = 0; k < cols; ++k) {
      const float q = std::clamp(std::nearbyint(row[k] / weight_scale[n]), -127.f, 127.f);
      weight_q[n * cols + k] = static_cast<std::int8_t>(q);
      row_sums[n] += static_cast<std::int64_t>(q);
    }
  }
  const QuantAlgo algo = options.algo;
  output.add(prefix + std::string(kWeight), "I8", {layer.out, layer.in}, bytes_of(weight_q), algo);

  if (algo == QuantAlgo::w8a8_static) {
    const ActivationParams params = activation_params(input, 0, input.steps, mul_scale);
    std::vector<std::int64_t> deq_scale(rows);
    std::vector<std::int32_t> quant_bias(rows);
    for (std::size_t n = 0; n < rows; ++n) {
      const float scale = params.scale * weight_scale[n];
      std::uint32_t bits;
      std::memcpy(&bits, &scale, sizeof bits);
      deq_scale[n] = static_cast<std::int64_t>(bits);
      // |offset| <= 128 and |sum| <= 127 * in: checked against int32 by the caller's bound.
      quant_bias[n] =
          static_cast<std::int32_t>(-static_cast<std::int64_t>(params.offset) * row_sums[n]);
    }
    output.add(prefix + std::string(kDeqScale), "I64", {layer.out}, bytes_of(deq_scale), algo);
    output.add(prefix + std::string(kQuantBias), "I32", {layer.out}, bytes_of(quant_bias), algo);
    output.add(prefix + std::string(kInputScale), "F32", {1},
               bytes_of(std::vector<float>{params.scale}), algo);
    output.add(prefix + std::string(kInputOffset), "F32", {1},
               bytes_of(std::vector<float>{params.offset}), algo);
  } else {
    output.add(prefix + std::string(kWeightScale), "F32", {layer.out}, bytes_of(weight_scale),
               algo);
    // Symmetric weights; msmodelslim writes the (zero) offsets all the same.
    output.add(prefix + std::string(kWeightOffset), "F32", {layer.out},
               bytes_of(std::vector<float>(rows, 0.f)), algo);
  }
  if (algo == QuantAlgo::w8a8_timestep) {
    // One static parameter pair per calibrated step; the layer runs dynamic at later steps.
    std::vector<float> scales, offsets;
    for (std::int64_t t = 0; t < input.steps; ++t) {
      const ActivationParams params = activation_params(input, t, t + 1, mul_scale);
      scales.push_back(params.scale);
      offsets.push_back(params.offset);
    }
    output.add(prefix + std::string(kInputScale), "F32", {input.steps}, bytes_of(scales), algo);
    output.add(prefix + std::string(kInputOffset), "F32", {input.steps}, bytes_of(offsets), algo);
  }
  if (layer.bias) {
    output.add(prefix + std::string(kBias), "F32", {layer.out},
               bytes_of(layer.bias->to_floats(weights.path())), algo);
  }
}

/// A tensor copied through unchanged, described as FLOAT.
void copy_float(const SafetensorsTensor& tensor, Output& output) {
  output.add(tensor.name, tensor.dtype.c_str(), tensor.shape,
             std::string(reinterpret_cast<const char*>(tensor.data),
                         static_cast<std::size_t>(tensor.bytes)),
             QuantAlgo::float_linear);
}

}  // namespace

QuantizeReport quantize_model(const SafetensorsFile& weights, const SafetensorsFile* calibration,
                              const std::string& out_dir, const QuantizeOptions& options) {
  const std::string call = kCall;
  if (options.algo == QuantAlgo::float_linear) {
    throw Error(call + ": algo FLOAT cannot be produced (W8A8, W8A8_DYNAMIC or W8A8_TIMESTEP)");
  }
  if (options.smooth_alpha && !(*options.smooth_alpha >= 0.f && *options.smooth_alpha <= 1.f)) {
    throw Error(call + ": smooth alpha " + std::to_string(*options.smooth_alpha) +
                " is outside [0, 1]");
  }
  if (!calibration && (options.algo != QuantAlgo::w8a8_dynamic || options.smooth_alpha)) {
    throw Error(call + ": " +
                (options.algo == QuantAlgo::w8a8_dynamic ? std::string("SmoothQuant")
                                                         : quant_algo_name(options.algo)) +
                " needs calibration (per-layer `<layer>.input` or `<layer>.input_range`); "
                "without it only W8A8_DYNAMIC without smoothing is possible");
  }

  // Layers first: the weights of rank 2, then every other tensor as it is.
  std::vector<Layer> layers;
  std::map<std::string, bool> is_layer_tensor;
  for (const std::string& name : weights.names()) {
    const SafetensorsTensor& tensor = weights.get(name);
    if (!name.ends_with(kWeight) || tensor.shape.size() != 2) continue;
    Layer layer{name.substr(0, name.size() - kWeight.size()), &tensor, nullptr, tensor.shape[0],
                tensor.shape[1]};
    layer.bias = weights.find(layer.name + std::string(kBias));
    if (layer.bias && layer.bias->shape != std::vector<std::int64_t>{layer.out}) {
      throw Error(call + ": " + weights.path() + ": tensor \"" + layer.bias->name +
                  "\" has shape " + layer.bias->shape_string() + ", expected [" +
                  std::to_string(layer.out) + "]");
    }
    // quant_bias = -offset * sum_k W_q[n, k] must fit int32: |.| <= 128 * 127 * in.
    if (layer.in > (std::int64_t{INT32_MAX} / (128 * 127))) {
      throw Error(call + ": layer \"" + layer.name + "\": " + std::to_string(layer.in) +
                  " input features overflow the int32 quant_bias");
    }
    is_layer_tensor[name] = true;
    if (layer.bias) is_layer_tensor[layer.bias->name] = true;
    layers.push_back(layer);
  }

  Output output;
  output.description[std::string(kModelQuantTypeKey)] = quant_algo_name(options.algo);
  QuantizeReport report;
  for (const Layer& layer : layers) {
    if (keep_float(layer.name, options)) {
      copy_float(*layer.weight, output);
      if (layer.bias) copy_float(*layer.bias, output);
      report.float_layers.push_back(layer.name);
    } else {
      quantize_layer(layer, weights, calibration, options, output);
      report.quantized_layers.push_back(layer.name);
    }
  }
  for (const std::string& name : weights.names()) {
    if (!is_layer_tensor.count(name)) copy_float(weights.get(name), output);
  }

  std::vector<SafetensorsEntry> entries;
  for (std::size_t i = 0; i < output.names.size(); ++i) {
    entries.push_back({output.names[i], output.dtypes[i], output.shapes[i], output.data[i]});
  }
  const std::filesystem::path dir(out_dir);
  report.weights_path = (dir / weight_file_name(options.algo, options.rank)).string();
  report.description_path = (dir / description_file_name(options.algo, options.rank)).string();
  // The weights first: a description never names a weights file that is not there yet.
  write_safetensors(report.weights_path, entries, {{"format", "pt"}});
  const std::string description = output.description.dump(2) + "\n";
  const std::string failure = core::replace_file(report.description_path, {description}, 0);
  if (!failure.empty()) throw Error(call + ": " + report.description_path + ": " + failure);
  return report;
}

}  // namespace ditops::loader

namespace ditops {

QuantizeReport quantize_export(std::span<const NamedTensor> weights,
                               std::span<const NamedTensor> calibration, const std::string& out_dir,
                               const QuantizeOptions& options) {
  constexpr const char* kExportCall = "quantize_export";
  const auto in_memory = [&](const char* what, std::span<const NamedTensor> tensors) {
    std::vector<loader::SafetensorsTensor> views;
    for (const NamedTensor& named : tensors) {
      views.push_back(loader::tensor_of_view(kExportCall, what, named));
    }
    return loader::SafetensorsFile::of_memory(what, std::move(views));
  };
  const loader::SafetensorsFile weight_set = in_memory("weights", weights);
  std::optional<loader::SafetensorsFile> calibration_set;
  if (!calibration.empty()) calibration_set = in_memory("calibration", calibration);
  return loader::quantize_model(weight_set, calibration_set ? &*calibration_set : nullptr, out_dir,
                                options);
}

}  // namespace ditops
