// ditops._ditops: the public C++ API over DLPack arrays (torch CPU tensors, numpy arrays).
// Every function takes its outputs as arguments, views every array as it is (no copy, any
// strides) and runs the C++ call with the GIL released; ditops::Error becomes ditops.Error, a
// ValueError carrying the same message. Allocating outputs and MindIE-SD's argument
// conventions live in the Python layer (python/ditops).

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <ditops/ditops.hpp>
#include <ditops/quant_model.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace ditops::python {
namespace {

using Array = nb::ndarray<nb::device::cpu>;
using OptionalArray = std::optional<Array>;

std::optional<DType> dtype_of(nb::dlpack::dtype dtype) {
  using Code = nb::dlpack::dtype_code;
  if (dtype.lanes != 1) return std::nullopt;
  const auto code = static_cast<Code>(dtype.code);
  if (code == Code::Float && dtype.bits == 32) return DType::f32;
  if (code == Code::Float && dtype.bits == 16) return DType::f16;
  if (code == Code::Bfloat && dtype.bits == 16) return DType::bf16;
  if (code == Code::Int && dtype.bits == 8) return DType::i8;
  if (code == Code::UInt && dtype.bits == 8) return DType::u8;
  if (code == Code::Int && dtype.bits == 32) return DType::i32;
  if (code == Code::Bool && dtype.bits == 8) return DType::boolean;
  return std::nullopt;
}

/// The array as a TensorView of its own memory; `name` names it in errors.
TensorView as_view(const Array& array, const char* name) {
  const auto dtype = dtype_of(array.dtype());
  if (!dtype) {
    throw Error(std::string(name) + " has a dtype ditops does not take (float32, float16, " +
                "bfloat16, int8, uint8, int32 or bool)");
  }
  if (array.ndim() > static_cast<std::size_t>(kMaxRank)) {
    throw Error(std::string(name) + " has " + std::to_string(array.ndim()) +
                " dimensions, at most " + std::to_string(kMaxRank));
  }
  TensorView view;
  view.data = array.data();
  view.dtype = *dtype;
  view.rank = static_cast<int>(array.ndim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = static_cast<std::int64_t>(array.shape(d));
    view.strides[d] = array.stride(d);
  }
  return view;
}

TensorView as_view(const OptionalArray& array, const char* name) {
  return array ? as_view(*array, name) : TensorView{};
}

/// An int32 vector argument (cu_seqlens, seq_lens): contiguous int32 values.
std::span<const std::int32_t> as_int32_span(const Array& array, const char* name) {
  const TensorView view = as_view(array, name);
  if (view.dtype != DType::i32 || view.rank != 1 || (view.shape[0] > 1 && view.strides[0] != 1)) {
    throw Error(std::string(name) + " must be a contiguous 1-D int32 array");
  }
  return {static_cast<const std::int32_t*>(view.data), static_cast<std::size_t>(view.shape[0])};
}

/// The algorithm `name` spells (quant_algo_name's spelling), one of `allowed`; Error naming
/// `call` and the allowed names otherwise.
QuantAlgo quant_algo_named(const char* call, const std::string& name,
                           std::initializer_list<QuantAlgo> allowed) {
  std::string names;  // "W8A8, W8A8_DYNAMIC or W8A8_TIMESTEP"
  std::size_t index = 0;
  for (const QuantAlgo known : allowed) {
    if (name == quant_algo_name(known)) return known;
    names += std::string(index == 0                    ? ""
                         : index + 1 == allowed.size() ? " or "
                                                       : ", ") +
             quant_algo_name(known);
    ++index;
  }
  throw Error(std::string(call) + "algo \"" + name + "\" is not " + names);
}

/// Named arrays as NamedTensors: views of their memory, which the caller keeps alive.
std::vector<NamedTensor> named_views(const std::vector<std::tuple<std::string, Array>>& arrays) {
  std::vector<NamedTensor> named;
  for (const auto& [name, array] : arrays) named.push_back({name, as_view(array, name.c_str())});
  return named;
}

AttentionBackend backend_from_name(const std::string& name) {
  for (const AttentionBackend backend :
       {AttentionBackend::automatic, AttentionBackend::reference, AttentionBackend::flash,
        AttentionBackend::flash_bf16, AttentionBackend::int8, AttentionBackend::sparse}) {
    if (name == backend_name(backend)) return backend;
  }
  throw Error("backend \"" + name + "\" is not one of the names backend_names() gives");
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const AttentionBackend backend :
       {AttentionBackend::automatic, AttentionBackend::reference, AttentionBackend::flash,
        AttentionBackend::flash_bf16, AttentionBackend::int8, AttentionBackend::sparse}) {
    names.emplace_back(backend_name(backend));
  }
  return names;
}

HeadPattern pattern_from_name(const std::string& name) {
  for (const HeadPattern pattern :
       {HeadPattern::dense, HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural}) {
    if (name == pattern_name(pattern)) return pattern;
  }
  throw Error("head pattern \"" + name + "\" is not dense, spatial, temporal or textural");
}

RotatedMode rotated_mode_from_name(const std::string& name) {
  if (name == "rotated_half") return RotatedMode::rotated_half;
  if (name == "rotated_interleaved") return RotatedMode::rotated_interleaved;
  throw Error("rotated_mode \"" + name + "\" is not rotated_half or rotated_interleaved");
}

Activation activation_from_name(const std::string& name) {
  if (name == "none") return Activation::none;
  if (name == "gelu_tanh") return Activation::gelu_tanh;
  if (name == "silu") return Activation::silu;
  throw Error("activation \"" + name + "\" is not none, gelu_tanh or silu");
}

/// What ran: (backend name, detail, from the tuning cache).
using Ran = std::tuple<std::string, std::string, bool>;
Ran ran_of(const AttentionChoice& choice) {
  return {backend_name(choice.backend), choice.detail, choice.from_cache};
}

AttentionOptions attention_options(const OptionalArray& mask, const OptionalArray& lse,
                                   std::optional<float> scale, bool causal, bool head_first,
                                   const std::string& backend, int int8_chunk) {
  AttentionOptions options;
  options.scale = scale;
  options.causal = causal;
  options.head_first = head_first;
  options.attn_mask = as_view(mask, "attn_mask");
  options.lse = as_view(lse, "lse");
  options.backend = backend_from_name(backend);
  options.int8_chunk = int8_chunk;
  return options;
}

/// RainFusion's options from keyword arguments, as one argument list for every call that
/// takes them.
RainFusionOptions rainfusion_options(std::int64_t frames, std::int64_t height, std::int64_t width,
                                     std::int64_t text_tokens, bool text_first, float sparsity,
                                     int textural_stride, float recall_threshold,
                                     bool dense_first_frame) {
  RainFusionOptions rf;
  rf.video = {frames, height, width, text_tokens, text_first};
  rf.sparsity = sparsity;
  rf.textural_stride = textural_stride;
  rf.recall_threshold = recall_threshold;
  rf.dense_first_frame = dense_first_frame;
  return rf;
}

// Calls that run kernels release the GIL: other Python threads go on meanwhile.
const nb::call_guard<nb::gil_scoped_release> release{};

// Threads, the CPU and the attention backends' names.
void bind_runtime(nb::module_& m) {
  m.def("backend_names", &backend_names);
  m.def("set_num_threads", &set_num_threads, nb::arg("n"));
  m.def("num_threads", &num_threads);
  m.def("cpu_info", [] {
    const CpuInfo info = cpu_info();
    nb::dict result;
    result["isa"] = info.isa;
    result["avx512"] = info.avx512;
    result["avx512_vnni"] = info.avx512_vnni;
    result["avx512_bf16"] = info.avx512_bf16;
    result["avx2"] = info.avx2;
    result["f16c"] = info.f16c;
    result["bf16_dot_full_rate"] = info.bf16_dot_full_rate;
    result["physical_cores"] = info.physical_cores;
    return result;
  });
}

// Dense and variable-length attention, the backend choice, merging partial results.
void bind_attention(nb::module_& m) {
  m.def(
      "attention_forward",
      [](const Array& q, const Array& k, const Array& v, const Array& out,
         const OptionalArray& mask, const OptionalArray& lse, std::optional<float> scale,
         bool causal, bool head_first, const std::string& backend, int int8_chunk) {
        AttentionOptions options =
            attention_options(mask, lse, scale, causal, head_first, backend, int8_chunk);
        AttentionChoice choice{};
        options.ran = &choice;
        attention_forward(as_view(q, "query"), as_view(k, "key"), as_view(v, "value"),
                          as_view(out, "out"), options);
        return ran_of(choice);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("mask").none(),
      nb::arg("lse").none(), nb::arg("scale").none(), nb::arg("causal"), nb::arg("head_first"),
      nb::arg("backend"), nb::arg("int8_chunk"), release);

  m.def(
      "select_attention",
      [](const Array& q, const Array& k, const Array& v, const OptionalArray& mask,
         std::optional<float> scale, bool causal, bool head_first, const std::string& backend) {
        const AttentionOptions options =
            attention_options(mask, std::nullopt, scale, causal, head_first, backend, 2);
        return ran_of(
            select_attention(as_view(q, "query"), as_view(k, "key"), as_view(v, "value"), options));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(), nb::arg("scale").none(),
      nb::arg("causal"), nb::arg("head_first"), nb::arg("backend"), release);

  m.def("forget_attention_tuning", &forget_attention_tuning);

  m.def(
      "attention_forward_varlen",
      [](const Array& q, const Array& k, const Array& v, const Array& cu_seqlens_q,
         const Array& cu_seqlens_k, const Array& out, const OptionalArray& lse,
         std::optional<float> scale, bool causal, const std::string& backend) {
        VarlenOptions options;
        options.scale = scale;
        options.causal = causal;
        options.lse = as_view(lse, "lse");
        options.backend = backend_from_name(backend);
        AttentionChoice choice{};
        options.ran = &choice;
        attention_forward_varlen(as_view(q, "q"), as_view(k, "k"), as_view(v, "v"),
                                 as_int32_span(cu_seqlens_q, "cu_seqlens_q"),
                                 as_int32_span(cu_seqlens_k, "cu_seqlens_k"), as_view(out, "out"),
                                 options);
        return ran_of(choice);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
      nb::arg("out"), nb::arg("lse").none(), nb::arg("scale").none(), nb::arg("causal"),
      nb::arg("backend"), release);

  m.def(
      "merge_attention_states",
      [](const Array& out_a, const Array& lse_a, const Array& out_b, const Array& lse_b,
         const Array& out, const Array& lse) {
        merge_attention_states(as_view(out_a, "out_a"), as_view(lse_a, "lse_a"),
                               as_view(out_b, "out_b"), as_view(lse_b, "lse_b"),
                               as_view(out, "out"), as_view(lse, "lse"));
      },
      nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"), nb::arg("out"),
      nb::arg("lse"), release);
}

// The row-wise operators: RoPE, the norms, classifier-free guidance.
void bind_rowwise(nb::module_& m) {
  m.def(
      "rotary_position_embedding",
      [](const Array& x, const Array& cos, const Array& sin, const Array& out,
         const std::string& mode, bool head_first) {
        rotary_position_embedding(as_view(x, "x"), as_view(cos, "cos"), as_view(sin, "sin"),
                                  as_view(out, "out"), rotated_mode_from_name(mode), head_first);
      },
      nb::arg("x"), nb::arg("cos"), nb::arg("sin"), nb::arg("out"), nb::arg("mode"),
      nb::arg("head_first"), release);

  m.def(
      "rms_norm_rotary_position_embedding",
      [](const Array& x, const OptionalArray& weight, float eps, const Array& cos, const Array& sin,
         const Array& out, const std::string& mode, bool head_first) {
        rms_norm_rotary_position_embedding(
            as_view(x, "x"), as_view(weight, "weight"), eps, as_view(cos, "cos"),
            as_view(sin, "sin"), as_view(out, "out"), rotated_mode_from_name(mode), head_first);
      },
      nb::arg("x"), nb::arg("weight").none(), nb::arg("eps"), nb::arg("cos"), nb::arg("sin"),
      nb::arg("out"), nb::arg("mode"), nb::arg("head_first"), release);

  m.def(
      "rms_norm",
      [](const Array& x, const Array& weight, float eps, const Array& out) {
        rms_norm(as_view(x, "x"), as_view(weight, "weight"), eps, as_view(out, "out"));
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("eps"), nb::arg("out"), release);

  m.def(
      "add_rms_norm",
      [](const Array& x, const Array& residual, const Array& weight, float eps, const Array& out,
         const Array& sum_out) {
        add_rms_norm(as_view(x, "x"), as_view(residual, "residual"), as_view(weight, "weight"), eps,
                     as_view(out, "out"), as_view(sum_out, "sum"));
      },
      nb::arg("x"), nb::arg("residual"), nb::arg("weight"), nb::arg("eps"), nb::arg("out"),
      nb::arg("sum_out"), release);

  // layer_norm when scale and shift are None, else layer_norm_scale_shift.
  m.def(
      "layer_norm_scale_shift",
      [](const Array& x, const OptionalArray& weight, const OptionalArray& bias,
         const OptionalArray& scale, const OptionalArray& shift, float eps, const Array& out) {
        if (!scale && !shift) {
          layer_norm(as_view(x, "x"), as_view(weight, "weight"), as_view(bias, "bias"), eps,
                     as_view(out, "out"));
          return;
        }
        layer_norm_scale_shift(as_view(x, "x"), as_view(weight, "weight"), as_view(bias, "bias"),
                               as_view(scale, "scale"), as_view(shift, "shift"), eps,
                               as_view(out, "out"));
      },
      nb::arg("x"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("scale").none(),
      nb::arg("shift").none(), nb::arg("eps"), nb::arg("out"), release);

  m.def(
      "cfg_combine",
      [](const Array& cond, const Array& uncond, float scale, const Array& out) {
        cfg_combine(as_view(cond, "cond"), as_view(uncond, "uncond"), scale, as_view(out, "out"));
      },
      nb::arg("cond"), nb::arg("uncond"), nb::arg("scale"), nb::arg("out"), release);
}

// RainFusion and block-sparse attention.
void bind_sparse(nb::module_& m) {
  nb::class_<RainFusionOptions>(m, "RainFusionOptions")
      .def(
          "__init__",
          [](RainFusionOptions* self, std::int64_t frames, std::int64_t height, std::int64_t width,
             std::int64_t text_tokens, bool text_first, float sparsity, int textural_stride,
             float recall_threshold, bool dense_first_frame) {
            new (self) RainFusionOptions(rainfusion_options(frames, height, width, text_tokens,
                                                            text_first, sparsity, textural_stride,
                                                            recall_threshold, dense_first_frame));
          },
          nb::kw_only(), nb::arg("frames"), nb::arg("height"), nb::arg("width"),
          nb::arg("text_tokens") = 0, nb::arg("text_first") = true, nb::arg("sparsity") = 0.64f,
          nb::arg("textural_stride") = 2, nb::arg("recall_threshold") = 0.95f,
          nb::arg("dense_first_frame") = true)
      .def_prop_ro("sparsity", [](const RainFusionOptions& rf) { return rf.sparsity; })
      .def_prop_ro("tokens", [](const RainFusionOptions& rf) {
        return rf.video.frames * rf.video.height * rf.video.width + rf.video.text_tokens;
      });

  m.def(
      "rainfusion_classify",
      [](const Array& q, const Array& k, const RainFusionOptions& rf, std::optional<float> scale,
         bool head_first) {
        AttentionOptions options;
        options.scale = scale;
        options.head_first = head_first;
        std::vector<std::string> names;
        for (const HeadPattern pattern :
             rainfusion_classify(as_view(q, "query"), as_view(k, "key"), rf, options)) {
          names.emplace_back(pattern_name(pattern));
        }
        return names;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("rf"), nb::arg("scale").none(), nb::arg("head_first"),
      release);

  m.def(
      "rainfusion_attention",
      [](const Array& q, const Array& k, const Array& v, const std::vector<std::string>& patterns,
         const Array& out, const RainFusionOptions& rf, const OptionalArray& lse,
         std::optional<float> scale, bool head_first) {
        std::vector<HeadPattern> heads;
        for (const std::string& name : patterns) heads.push_back(pattern_from_name(name));
        AttentionOptions options;
        options.scale = scale;
        options.head_first = head_first;
        options.lse = as_view(lse, "lse");
        rainfusion_attention(as_view(q, "query"), as_view(k, "key"), as_view(v, "value"), heads,
                             as_view(out, "out"), rf, options);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("patterns"), nb::arg("out"), nb::arg("rf"),
      nb::arg("lse").none(), nb::arg("scale").none(), nb::arg("head_first"), release);

  m.def(
      "block_sparse_attention",
      [](const Array& q, const Array& k, const Array& v, const Array& block_mask, int block_size,
         const Array& out, const OptionalArray& lse, std::optional<float> scale, bool head_first) {
        AttentionOptions options;
        options.scale = scale;
        options.head_first = head_first;
        options.lse = as_view(lse, "lse");
        block_sparse_attention(as_view(q, "query"), as_view(k, "key"), as_view(v, "value"),
                               as_view(block_mask, "block_mask"), block_size, as_view(out, "out"),
                               options);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("block_mask"), nb::arg("block_size"),
      nb::arg("out"), nb::arg("lse").none(), nb::arg("scale").none(), nb::arg("head_first"),
      release);
}

// MLA paged decode and its cache.
void bind_mla(nb::module_& m) {
  m.def(
      "mla_decode_paged",
      [](const Array& q_nope, const Array& q_rope, const Array& nope, const Array& nope_scale,
         const Array& rope, const Array& block_table, const Array& seq_lens, const Array& out,
         std::optional<float> scale, int chunk, int num_splits) {
        MlaDecodeOptions options;
        options.scale = scale;
        options.chunk = chunk;
        options.num_splits = num_splits;
        const MlaPagedCache cache{as_view(nope, "nope"), as_view(nope_scale, "nope_scale"),
                                  as_view(rope, "rope")};
        mla_decode_paged(as_view(q_nope, "q_nope"), as_view(q_rope, "q_rope"), cache,
                         as_view(block_table, "block_table"), as_int32_span(seq_lens, "seq_lens"),
                         as_view(out, "out"), options);
      },
      nb::arg("q_nope"), nb::arg("q_rope"), nb::arg("nope"), nb::arg("nope_scale"), nb::arg("rope"),
      nb::arg("block_table"), nb::arg("seq_lens"), nb::arg("out"), nb::arg("scale").none(),
      nb::arg("chunk"), nb::arg("num_splits"), release);

  m.def(
      "mla_fill_cache",
      [](const Array& latent, const Array& slots, const Array& nope, const Array& nope_scale,
         const Array& rope) {
        const MlaPagedCache cache{as_view(nope, "nope"), as_view(nope_scale, "nope_scale"),
                                  as_view(rope, "rope")};
        mla_fill_cache(as_view(latent, "latent"), as_view(slots, "slots"), cache);
      },
      nb::arg("latent"), nb::arg("slots"), nb::arg("nope"), nb::arg("nope_scale"), nb::arg("rope"),
      release);
}

// Quantized linear layers, quantized models and msmodelslim exports.
void bind_linear(nb::module_& m) {
  nb::class_<QuantLinear>(m, "QuantLinear")
      .def_prop_ro("algo", [](const QuantLinear& l) { return quant_algo_name(l.algo()); })
      .def_prop_ro("in_features", &QuantLinear::in_features)
      .def_prop_ro("out_features", &QuantLinear::out_features)
      .def_prop_ro("weight_bytes", &QuantLinear::weight_bytes)
      .def(
          "forward",
          [](const QuantLinear& layer, const Array& x, const Array& y,
             const std::string& activation) {
            layer.forward(as_view(x, "x"), as_view(y, "y"), activation_from_name(activation));
          },
          nb::arg("x"), nb::arg("y"), nb::arg("activation") = "none", release)
      .def_static(
          "float_linear",
          [](const Array& weight, const OptionalArray& bias) {
            return QuantLinear::float_linear(as_view(weight, "weight"), as_view(bias, "bias"));
          },
          nb::arg("weight"), nb::arg("bias").none() = nb::none(), release)
      // A W8A8 layer from tensors in memory (algo "W8A8" or "W8A8_DYNAMIC"; a W8A8_TIMESTEP
      // layer follows a model's step, so it comes from QuantModel).
      .def_static(
          "w8a8",
          [](const std::string& algo, const Array& weight, const OptionalArray& weight_scale,
             const OptionalArray& deq_scale, const OptionalArray& quant_bias,
             const OptionalArray& input_scale, const OptionalArray& input_offset,
             const OptionalArray& bias, const OptionalArray& smooth_scale) {
            const QuantAlgo parsed =
                quant_algo_named("", algo, {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic});
            const W8A8Tensors tensors{as_view(weight, "weight"),
                                      as_view(weight_scale, "weight_scale"),
                                      as_view(deq_scale, "deq_scale"),
                                      as_view(quant_bias, "quant_bias"),
                                      as_view(input_scale, "input_scale"),
                                      as_view(input_offset, "input_offset"),
                                      as_view(bias, "bias"),
                                      as_view(smooth_scale, "smooth_scale")};
            return QuantLinear::w8a8(parsed, tensors);
          },
          nb::arg("algo"), nb::arg("weight"), nb::arg("weight_scale").none() = nb::none(),
          nb::arg("deq_scale").none() = nb::none(), nb::arg("quant_bias").none() = nb::none(),
          nb::arg("input_scale").none() = nb::none(), nb::arg("input_offset").none() = nb::none(),
          nb::arg("bias").none() = nb::none(), nb::arg("smooth_scale").none() = nb::none(),
          release);

  // An msmodelslim export of a model in memory: (description path, weights path, quantized
  // layers, layers kept FLOAT).
  m.def(
      "quantize_export",
      [](const std::vector<std::tuple<std::string, Array>>& weights,
         const std::vector<std::tuple<std::string, Array>>& calibration, const std::string& out_dir,
         const std::string& algo, const std::vector<std::string>& float_patterns,
         std::optional<float> smooth_alpha, int rank) {
        QuantizeOptions options;
        options.algo = quant_algo_named(
            "quantize_export: ", algo,
            {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::w8a8_timestep});
        options.float_patterns = float_patterns;
        options.smooth_alpha = smooth_alpha;
        options.rank = rank;
        const std::vector<NamedTensor> weight_views = named_views(weights);
        const std::vector<NamedTensor> calibration_views = named_views(calibration);
        nb::gil_scoped_release unlocked;
        QuantizeReport report = quantize_export(weight_views, calibration_views, out_dir, options);
        return std::make_tuple(std::move(report.description_path), std::move(report.weights_path),
                               std::move(report.quantized_layers), std::move(report.float_layers));
      },
      nb::arg("weights"), nb::arg("calibration"), nb::arg("out_dir"), nb::arg("algo"),
      nb::arg("float_patterns"), nb::arg("smooth_alpha").none(), nb::arg("rank"));

  nb::class_<QuantModel>(m, "QuantModel")
      .def_static(
          "load",
          [](const std::string& description, const std::string& weights_path,
             const std::vector<std::tuple<int, int>>& static_ranges) {
            QuantModelOptions options;
            options.weights_path = weights_path;
            for (const auto& [first, last] : static_ranges) {
              options.timestep_policy.set(first, last, TimestepMode::static_params);
            }
            return QuantModel::load(description, std::move(options));
          },
          nb::arg("description"), nb::arg("weights_path") = "",
          nb::arg("static_ranges") = std::vector<std::tuple<int, int>>{}, release)
      .def_prop_ro("model_algo",
                   [](const QuantModel& model) { return quant_algo_name(model.model_algo()); })
      .def("layer_names", &QuantModel::layer_names)
      .def("layer_algo",
           [](const QuantModel& model, const std::string& name) {
             return quant_algo_name(model.layer_algo(name));
           })
      .def(
          "linear",
          [](const QuantModel& model, const std::string& name) { return model.linear(name); },
          release)
      .def(
          "float_tensor",
          [](const QuantModel& model, const std::string& name) { return model.float_tensor(name); },
          nb::arg("name"), release)
      .def("set_timestep_step", &QuantModel::set_timestep_step, nb::arg("step"))
      .def("timestep_step", [](const QuantModel& model) { return model.timestep()->step(); });
}

}  // namespace

NB_MODULE(_ditops, m) {
  m.doc() = "ditops' C++ API over DLPack arrays; use the ditops package, not this module.";
  nb::exception<Error>(m, "Error", PyExc_ValueError);
  bind_runtime(m);
  bind_attention(m);
  bind_rowwise(m);
  bind_sparse(m);
  bind_mla(m);
  bind_linear(m);
}

}  // namespace ditops::python
