#pragma once
// Linear layers y = x · Wᵀ + bias with int8 weights and int8 activations (W8A8: static,
// dynamic per-token and timestep-aware quantization, as msmodelslim exports them for
// MindIE-SD), and the fp32 / bf16 layers a quantized model leaves in floating point.
// load_quant_model() (ditops/quant_model.hpp) builds them from files; the constructors below
// take tensors already in memory, so a caller can build layers without any file.

#include <atomic>
#include <cstdint>
#include <ditops/tensor.hpp>
#include <memory>
#include <string>
#include <vector>

namespace ditops {

/// How a layer computes: the quantization algorithm of a description file's entry.
enum class QuantAlgo : std::uint8_t {
  float_linear,   ///< "FLOAT": fp32 (or bf16 weights widened to fp32), not quantized
  w8a8_static,    ///< "W8A8": x_q = clamp(round(x / input_scale + input_offset), -128, 127)
  w8a8_dynamic,   ///< "W8A8_DYNAMIC": per-token symmetric x_q = round(x / (max|x_row| / 127))
  w8a8_timestep,  ///< "W8A8_TIMESTEP": static or dynamic per denoising step (TimestepPolicy)
};
/// "FLOAT", "W8A8", "W8A8_DYNAMIC", "W8A8_TIMESTEP" (the description file's spelling).
const char* quant_algo_name(QuantAlgo algo) noexcept;

/// An activation forward() applies to y in its epilogue, after the bias and before the cast to
/// y's dtype (the MLP's GELU of DiT blocks, the SiLU of SwiGLU gates):
///   gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))
///   silu(v)      = v / (1 + exp(-v))
/// Both go to -0 for v -> -inf (never NaN) and to v for v -> +inf; NaN stays NaN.
enum class Activation : std::uint8_t { none, gelu_tanh, silu };

/// Activation quantization of one denoising step of a W8A8_TIMESTEP layer.
enum class TimestepMode : std::uint8_t { dynamic, static_params };

/// Which steps use their static parameters; every other step is dynamic.
class TimestepPolicy {
 public:
  /// Steps first..last (inclusive, 0-based) use `mode`; later calls override earlier ones.
  /// Throws Error for first < 0 or last < first.
  TimestepPolicy& set(int first, int last, TimestepMode mode);
  TimestepPolicy& set(int step, TimestepMode mode) { return set(step, step, mode); }
  TimestepMode mode_at(int step) const noexcept;

 private:
  struct Range {
    int first, last;
    TimestepMode mode;
  };
  std::vector<Range> ranges_;
};

/// The denoising step of one model instance, read by its W8A8_TIMESTEP layers at every
/// forward: each model (each instance of it) has its own, so two instances can be at different
/// steps. set_step may be called from any thread, also while other threads run forward().
class Timestep {
 public:
  explicit Timestep(TimestepPolicy policy = {}) : policy_(std::move(policy)) {}
  /// Throws Error for step < 0.
  void set_step(int step);
  int step() const noexcept { return step_.load(std::memory_order_acquire); }
  TimestepMode mode() const noexcept { return policy_.mode_at(step()); }
  const TimestepPolicy& policy() const noexcept { return policy_; }

 private:
  TimestepPolicy policy_;
  std::atomic<int> step_{0};
};

/// The tensors of one W8A8 layer, as views of memory the caller owns (copied and packed by the
/// constructor). out = output features N, in = input features K. Which fields a layer needs:
///   static:   weight, deq_scale, quant_bias, input_scale, input_offset ([1]); bias optional
///             y = (x_q · Wᵀ + quant_bias) · deq_scale + bias
///   dynamic:  weight, weight_scale; bias optional
///             y = s_row · (x_q · Wᵀ) · weight_scale + bias,  s_row = max|x_row| / 127
///   timestep: weight, weight_scale, input_scale and input_offset ([T], one per step); a
///             static step t computes y = input_scale[t] · weight_scale ·
///             (x_q · Wᵀ - input_offset[t] · Σ_k W[n, k]) + bias, a dynamic step as above;
///             steps >= T are dynamic only.
/// smooth_scale (SmoothQuant's div.mul_scale, [in]) multiplies x before quantization, where
/// present. Weights must be int8 in [-128, 127]; scales f32 (finite, scales > 0); quant_bias
/// i32; bias f32; a [N, 1] weight_scale or a [1] / [T, 1] input_scale is accepted too.
struct W8A8Tensors {
  TensorView weight;        ///< i8 [out, in]
  TensorView weight_scale;  ///< f32 [out]
  TensorView deq_scale;     ///< f32 [out]
  TensorView quant_bias;    ///< i32 [out]
  TensorView input_scale;   ///< f32 [1] or [T]
  TensorView input_offset;  ///< f32 [1] or [T]
  TensorView bias;          ///< f32 [out], or empty
  TensorView smooth_scale;  ///< f32 [in], or empty
};

/// One linear layer, ready to run: weights packed for this CPU once, at construction.
/// Cheap to copy (the packed weights are shared, read-only); forward() is const and may run
/// from several threads at once (each call takes its own scratch).
class QuantLinear {
 public:
  /// A FLOAT layer: weight f32 or bf16 [out, in]; bias f32 [out] or empty.
  /// What forward() computes, before the bias (f32) and the activation:
  ///   - bf16 weights, bf16 x: Σ_k x · W, each product of two bf16 exact, summed in fp32 (what
  ///     torch's bf16 linear computes, up to the order of the sum), on bf16 dot products where
  ///     the CPU has them (vdpbf16ps with AVX512-BF16, TDPBF16PS on AMX; both read a denormal
  ///     bf16 input as 0);
  ///   - bf16 weights, fp32 x: fp32 x times the exact bf16 weights, summed in fp32 (x is never
  ///     rounded to bf16);
  ///   - fp32 weights: x (bf16 x widened) times the weights in fp32, summed in fp32.
  static QuantLinear float_linear(const TensorView& weight, const TensorView& bias);
  /// A W8A8 layer of algorithm `algo` (not float_linear). `timestep` is required for
  /// w8a8_timestep (the model instance's step) and must be null otherwise.
  static QuantLinear w8a8(QuantAlgo algo, const W8A8Tensors& tensors,
                          std::shared_ptr<const Timestep> timestep = nullptr);
  /// One layer computing [a, b, c, ...] along the output features: the fused QKV projection
  /// (one GEMM reads x once for Q, K and V). The parts must have the same algorithm, input
  /// features and timestep; static parts must share input_scale and input_offset (calibrated
  /// on the same input they are equal; if not, the fusion is refused with Error).
  static QuantLinear concat_outputs(const std::vector<QuantLinear>& parts);

  /// y = layer(x). x: [..., in] f32 or bf16; y: [..., out] f32 or bf16, the same leading shape.
  /// Both have rows with any strides and the last dim contiguous, so y may be a view into rows
  /// of a larger buffer (e.g. [batch, T, out] with row stride 3 · out, one third of a fused
  /// output); y must not overlap x.
  void forward(const TensorView& x, const TensorView& y) const;
  /// y = activation(layer(x)), in the same pass (x, y as above).
  void forward(const TensorView& x, const TensorView& y, Activation activation) const;

  QuantAlgo algo() const noexcept;
  std::int64_t in_features() const noexcept;
  std::int64_t out_features() const noexcept;
  /// Bytes of packed weights and per-feature parameters this layer holds (shared by copies).
  std::int64_t weight_bytes() const noexcept;

  struct Impl;
  explicit QuantLinear(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ditops
