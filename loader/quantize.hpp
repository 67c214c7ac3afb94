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
//   timestep (W8A8_TIMESTEP): weight_scale, and input_scale / input_offset [T] as static's,
//            one pair per calibrated denoising step (dynamic at later steps)
//   SmoothQuant (optional): s_k = max|x_k|^alpha / max_n |W[n, k]|^(1 - alpha), W' = W * s,
//            div.mul_scale = 1 / s (the layer computes x * mul_scale)

#include <ditops/quant_model.hpp>
#include <string>

#include "loader/safetensors.hpp"

namespace ditops::loader {

/// Quantizes every linear layer of `weights` (a tensor `<layer>.weight` of rank 2, F32, F16 or
/// BF16 [out, in], with an optional `<layer>.bias` [out]) and writes the pair into `out_dir`
/// (which must exist). `calibration` holds, per quantized layer, its input activations
/// `<layer>.input` [rows, in] (any leading shape; one step) or the ranges a calibration run
/// recorded, `<layer>.input_range` [2, in] or [steps, 2, in] (each input channel's maximum, then
/// its minimum, per denoising step); W8A8, W8A8_TIMESTEP and SmoothQuant need it (W8A8 and
/// SmoothQuant take the range over all steps). Every other tensor
/// of `weights` is copied unchanged and described as FLOAT. Error naming the file, layer and
/// tensor for anything missing or malformed; nothing is written then.
QuantizeReport quantize_model(const SafetensorsFile& weights, const SafetensorsFile* calibration,
                              const std::string& out_dir, const QuantizeOptions& options);

}  // namespace ditops::loader
