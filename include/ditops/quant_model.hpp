#pragma once
// A quantized model exported by msmodelslim for MindIE-SD: a description JSON naming each
// layer's algorithm, and the safetensors file(s) holding the tensors. Layers come out as
// QuantLinear (ditops/linear.hpp); the files are read once, memory-mapped, and validated.
// write_safetensors writes the other end: a floating-point model for tools/ditops-quantize.

#include <ditops/linear.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ditops {

struct QuantModelOptions {
  /// The safetensors file; empty: the one the description names beside it,
  /// quant_model_weight_{algo lower}[_{rank}].safetensors.
  std::string weights_path;
  /// Steps that use static parameters in W8A8_TIMESTEP layers (every other step is dynamic).
  TimestepPolicy timestep_policy;
};

/// One loaded model instance. Layers built from it share its Timestep (set_timestep_step).
class QuantModel {
 public:
  /// Reads `description_path` and the weights. Throws Error naming the file, the tensor or
  /// key, and what is wrong (missing, wrong dtype or shape, malformed header, out-of-file
  /// offsets, unknown algorithm) before returning.
  static QuantModel load(const std::string& description_path, QuantModelOptions options = {});

  /// The description's global algorithm ("model_quant_type").
  QuantAlgo model_algo() const noexcept;
  /// The algorithm the description gives layer `name` (a key `name.linear.weight`,
  /// `name.weight`, `name` or `name.quant_type`); Error if none matches.
  QuantAlgo layer_algo(std::string_view name) const;
  /// Names of the layers the description lists (without the key suffixes), sorted.
  std::vector<std::string> layer_names() const;

  /// Layer `name`, its weights packed for this CPU. Error naming the layer and tensor if the
  /// weights file lacks what its algorithm needs.
  QuantLinear linear(std::string_view name) const;
  /// Q, K and V projections as one layer (QuantLinear::concat_outputs).
  QuantLinear fused_qkv(std::string_view q, std::string_view k, std::string_view v) const;
  /// A tensor the model keeps in floating point that is not a linear layer (a norm's weight,
  /// an embedding), by its name in the weights file: its elements in row-major order, F16 and
  /// BF16 widened to f32. Error naming the file and the tensor if it is missing or of another
  /// dtype.
  std::vector<float> float_tensor(std::string_view name) const;

  /// This instance's denoising step, read by its W8A8_TIMESTEP layers.
  void set_timestep_step(int step) { timestep_->set_step(step); }
  const std::shared_ptr<Timestep>& timestep() const noexcept { return timestep_; }

  struct Files;

 private:
  QuantModel(std::shared_ptr<const Files> files, std::shared_ptr<Timestep> timestep)
      : files_(std::move(files)), timestep_(std::move(timestep)) {}
  std::shared_ptr<const Files> files_;
  std::shared_ptr<Timestep> timestep_;
};

/// A tensor of a file to write: its name and a contiguous view of any ditops dtype.
struct NamedTensor {
  std::string name;
  TensorView tensor;
};

/// Writes `tensors` as a safetensors file at `path` (each tensor aligned to its element size),
/// through a temporary file renamed over the target, so a reader never sees a part. What
/// ditops-quantize takes is such a file of F32 `<layer>.weight` [out, in] and `<layer>.bias`
/// [out] tensors. Error naming the call, the file and the tensor for a view that is malformed
/// or not contiguous, a name that is empty or repeated, an existing `path` that is not a
/// regular file, or a failed write.
void write_safetensors(const std::string& path, std::span<const NamedTensor> tensors);

struct QuantizeOptions {
  QuantAlgo algo = QuantAlgo::w8a8_static;  ///< any but float_linear
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

/// Post-training quantization of a model held in memory (a state dict's tensors, contiguous,
/// F32, F16 or BF16) into msmodelslim's file pair in `out_dir`, as tools/ditops-quantize does
/// with files (docs/quantization.md gives the arithmetic): every `<layer>.weight` of rank 2
/// (with an optional `<layer>.bias`) is a linear layer, every other tensor is written as it is
/// and described FLOAT. `calibration` holds per quantized layer `<layer>.input` [rows, in] or
/// `<layer>.input_range` [steps, 2, in] (each input channel's maximum, then minimum, per
/// denoising step); empty: none (W8A8_DYNAMIC without smoothing only). Error naming the call,
/// the layer and the tensor before anything is written.
QuantizeReport quantize_export(std::span<const NamedTensor> weights,
                               std::span<const NamedTensor> calibration, const std::string& out_dir,
                               const QuantizeOptions& options);

}  // namespace ditops
