#pragma once
// Post-training W8A8 quantization of linear layers into msmodelslim's file pair (a description
// JSON and a safetensors file): what tools/ditops-quantize runs, callable from tests.
//
//   weights: per output channel symmetric, scale_n = max_k |W[n, k]| / 127,
//            W_q = round(W / scale_n) in [-127, 127]
//   static activations (W8A8): per tensor asymmetric from the calibration inputs' range
//            (widened to hold 0), input_scale = (max - min) / 255,
//            input_offset = clamp(round(-128 - min / input_scale), -128, 127),
//            deq_scale = input_scale * weight_scale (fp32 bits in an int64, as msmodelslim
//            writes it), quant_bias = -input_offset * sum_k W_q[n, k]
//   dynamic activations (W8A8_DYNAMIC): per token at run time; weight_scale is written
//   SmoothQuant (optional): s_k = max|x_k|^alpha / max_n |W[n, k]|^(1 - alpha), W' = W * s,
//            div.mul_scale = 1 / s (the layer computes x * mul_scale)

#include <ditops/linear.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loader/safetensors.hpp"

namespace ditops::loader {

struct QuantizeOptions {
  QuantAlgo algo = QuantAlgo::w8a8_static;  ///< w8a8_static or w8a8_dynamic
  /// Layers whose name matches one of these shell patterns (fnmatch) stay FLOAT.
  std::vector<std::string> float_patterns;
  /// SmoothQuant's migration strength alpha in [0, 1]; none: no smoothing.
  std::optional<float> smooth_alpha;
  /// Card index of a multi-card export (the _{rank} file-name suffix); < 0: none.
  int rank = -1;
};

struct QuantizeReport {
  std::string description_path;
  std::string weights_path;
  std::vector<std::string> quantized_layers;  ///< sorted
  std::vector<std::string> float_layers;      ///< linear layers kept FLOAT, sorted
};

/// Quantizes every linear layer of `weights` (a tensor `<layer>.weight` of rank 2, F32, F16 or
/// BF16 [out, in], with an optional `<layer>.bias` [out]) and writes the pair into `out_dir`
/// (which must exist). `calibration` holds `<layer>.input` activations [rows, in] (any leading
/// shape) per quantized layer; static quantization and SmoothQuant need it. Every other tensor
/// of `weights` is copied unchanged and described as FLOAT. Error naming the file, layer and
/// tensor for anything missing or malformed; nothing is written then.
QuantizeReport quantize_model(const SafetensorsFile& weights, const SafetensorsFile* calibration,
                              const std::string& out_dir, const QuantizeOptions& options);

}  // namespace ditops::loader
