#include "loader/quantize.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
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

/// A layer's calibration input as floats [rows, in].
std::vector<float> calibration_input(const SafetensorsFile& calibration, const Layer& layer) {
  const std::string name = layer.name + std::string(kCalibrationInput);
  const SafetensorsTensor& input = calibration.get(name);
  if (input.shape.empty() || input.shape.back() != layer.in || input.numel() == 0) {
    throw Error(std::string(kCall) + ": calibration file " + calibration.path() + ": tensor \"" +
                name + "\" has shape " + input.shape_string() + ", expected [rows, " +
                std::to_string(layer.in) + "] with rows > 0");
  }
  return input.to_floats(calibration.path());
}

/// SmoothQuant's per-input-channel factors s (W' = W * s, x' = x / s).
std::vector<float> smooth_factors(const std::vector<float>& weight, const std::vector<float>& x,
                                  const Layer& layer, float alpha) {
  std::vector<float> x_max(static_cast<std::size_t>(layer.in), 0.f);
  std::vector<float> w_max(static_cast<std::size_t>(layer.in), 0.f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    float& max = x_max[i % x_max.size()];
    max = std::max(max, std::fabs(x[i]));
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

void quantize_layer(const Layer& layer, const SafetensorsFile& weights,
                    const SafetensorsFile* calibration, const QuantizeOptions& options,
                    Output& output) {
  const auto rows = static_cast<std::size_t>(layer.out);
  const auto cols = static_cast<std::size_t>(layer.in);
  std::vector<float> weight = layer.weight->to_floats(weights.path());
  std::vector<float> input;
  const bool needs_input = options.algo == QuantAlgo::w8a8_static || options.smooth_alpha;
  if (needs_input) input = calibration_input(*calibration, layer);

  // msmodelslim's layout of a smoothed layer: the factors as `name.div.mul_scale` (FLOAT), the
  // layer's tensors under `name.linear`.
  std::string prefix = layer.name;
  if (options.smooth_alpha) {
    const std::vector<float> factors = smooth_factors(weight, input, layer, *options.smooth_alpha);
    std::vector<float> mul_scale(cols);
    for (std::size_t k = 0; k < cols; ++k) mul_scale[k] = 1.f / factors[k];
    for (std::size_t i = 0; i < weight.size(); ++i) weight[i] *= factors[i % cols];
    // The layer multiplies x by mul_scale before quantizing: calibrate on what it quantizes.
    for (std::size_t i = 0; i < input.size(); ++i) input[i] *= mul_scale[i % cols];
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
    // The range holds 0, as PyTorch's observers make it: zero inputs (padding) stay exact.
    float min = 0.f, max = 0.f;
    for (const float x : input) {
      min = std::min(min, x);
      max = std::max(max, x);
    }
    if (!std::isfinite(min) || !std::isfinite(max)) {
      throw Error(std::string(kCall) + ": calibration file " + calibration->path() + ": tensor \"" +
                  layer.name + std::string(kCalibrationInput) + "\" holds a non-finite value");
    }
    const float input_scale = max > min ? (max - min) / 255.f : 1.f;
    const float input_offset =
        std::clamp(std::nearbyint(-128.f - min / input_scale), -128.f, 127.f);
    std::vector<std::int64_t> deq_scale(rows);
    std::vector<std::int32_t> quant_bias(rows);
    for (std::size_t n = 0; n < rows; ++n) {
      const float scale = input_scale * weight_scale[n];
      std::uint32_t bits;
      std::memcpy(&bits, &scale, sizeof bits);
      deq_scale[n] = static_cast<std::int64_t>(bits);
      // |offset| <= 128 and |sum| <= 127 * in: checked against int32 by the caller's bound.
      quant_bias[n] =
          static_cast<std::int32_t>(-static_cast<std::int64_t>(input_offset) * row_sums[n]);
    }
    output.add(prefix + std::string(kDeqScale), "I64", {layer.out}, bytes_of(deq_scale), algo);
    output.add(prefix + std::string(kQuantBias), "I32", {layer.out}, bytes_of(quant_bias), algo);
    output.add(prefix + std::string(kInputScale), "F32", {1},
               bytes_of(std::vector<float>{input_scale}), algo);
    output.add(prefix + std::string(kInputOffset), "F32", {1},
               bytes_of(std::vector<float>{input_offset}), algo);
  } else {
    output.add(prefix + std::string(kWeightScale), "F32", {layer.out}, bytes_of(weight_scale),
               algo);
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
  if (options.algo != QuantAlgo::w8a8_static && options.algo != QuantAlgo::w8a8_dynamic) {
    throw Error(call + ": algo " + quant_algo_name(options.algo) +
                " cannot be produced (W8A8 or W8A8_DYNAMIC)");
  }
  if (options.smooth_alpha && !(*options.smooth_alpha >= 0.f && *options.smooth_alpha <= 1.f)) {
    throw Error(call + ": smooth alpha " + std::to_string(*options.smooth_alpha) +
                " is outside [0, 1]");
  }
  if (!calibration && (options.algo == QuantAlgo::w8a8_static || options.smooth_alpha)) {
    throw Error(call + ": " +
                (options.algo == QuantAlgo::w8a8_static ? "static W8A8" : "SmoothQuant") +
                " needs a calibration file (per-layer inputs `<layer>.input`); without one only "
                "W8A8_DYNAMIC without smoothing is possible");
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
