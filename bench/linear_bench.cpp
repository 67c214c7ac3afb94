// Linear layers: the W8A8 GEMM (dynamic and static activations) and the FLOAT path, beside
// Eigen's fp32 GEMM (and oneDNN's int8 matmul where built with it) with the same threads, in
// one process. This file alone is compiled for the build machine's CPU (-march=native), so
// the peers run as a user would build them; ditops dispatches at run time as always.
//
// Shapes: FLUX's hidden size (3072) with its image tokens (4608) -- QKV / out-projection
// sized --, a short batch of rows (16: a text encoder step, a decode-like call), the thin
// output projections of DiTs (16 and 64 output features: patch un-embedding) and an odd shape
// (no size a multiple of any tile), then FLUX's MLP pair (3072 -> 12288 -> 3072).
// Kinds: 0 W8A8_DYNAMIC, 1 W8A8 static, 2 FLOAT (f32), 3 Eigen f32 GEMM, 4 oneDNN s8 x s8 (the
// GEMM alone, on activations quantized beforehand), 5 oneDNN's static W8A8 layer (an f32 -> s8
// reorder with the input scale, then the s8 x s8 matmul: the work of ditops' W8A8 static).
// misaligned = 1 puts x and y 16 bytes past a cache line, as allocators do.
// frac_int8 is of the measured int8 dot-product peak; frac_peak of the FP32 FMA peak; frac_mem
// (W8A8 layers) of the memory bound, x and the weights read and y written once at the triad
// bandwidth. BM_linear_bf16 (below): FLOAT layers of bf16 weights at FLUX's attention and MLP
// sizes.

#include <Eigen/Core>
#include <ditops/linear.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <vector>

#include "bench/support.hpp"

#ifdef DITOPS_BENCH_DNNL
#include <omp.h>

#include <dnnl.hpp>
#endif

namespace ditops::bench {
namespace {

struct GemmShape {
  std::int64_t m, k, n;
};
constexpr GemmShape kShapes[] = {{4608, 3072, 3072}, {16, 3072, 3072},  {4608, 3072, 16},
                                 {4608, 3072, 64},   {1111, 1537, 777}, {4608, 3072, 12288},
                                 {4608, 12288, 3072}};

enum Kind { kDynamic = 0, kStatic = 1, kFloat = 2, kEigen = 3, kDnnl = 4, kDnnlLayer = 5 };

const char* kind_name(int kind) {
  static const char* const names[] = {"ditops W8A8_DYNAMIC", "ditops W8A8", "ditops FLOAT f32",
                                      "Eigen f32",           "oneDNN s8s8", "oneDNN quantize+s8s8"};
  return names[kind];
}

/// A random layer of `kind` with per-channel weight scales as a quantizer would make them.
QuantLinear make_layer(int kind, const GemmShape& shape) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::size_t count = static_cast<std::size_t>(shape.n * shape.k);
  if (kind == kFloat) {
    std::vector<float> weight(count);
    for (float& w : weight) w = normal(rng) * 0.02f;
    return QuantLinear::float_linear(view(weight.data(), {shape.n, shape.k}), {});
  }
  std::vector<std::int8_t> weight(count);
  std::uniform_int_distribution<int> level(-127, 127);
  for (auto& w : weight) w = static_cast<std::int8_t>(level(rng));
  std::vector<float> scale(static_cast<std::size_t>(shape.n), 1e-4f);
  std::vector<std::int32_t> quant_bias(static_cast<std::size_t>(shape.n), 0);
  std::vector<float> bias(static_cast<std::size_t>(shape.n), 0.5f);
  float input_scale = 0.03f, input_offset = 0.f;
  W8A8Tensors tensors;
  tensors.weight = view(weight.data(), {shape.n, shape.k});
  tensors.weight_scale = tensors.deq_scale = view(scale.data(), {shape.n});
  tensors.quant_bias = view(quant_bias.data(), {shape.n});
  tensors.bias = view(bias.data(), {shape.n});
  tensors.input_scale = view(&input_scale, {1});
  tensors.input_offset = view(&input_offset, {1});
  return QuantLinear::w8a8(kind == kStatic ? QuantAlgo::w8a8_static : QuantAlgo::w8a8_dynamic,
                           tensors);
}

void BM_linear(benchmark::State& state) {
  const GemmShape shape = kShapes[state.range(0)];
  const int kind = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const std::int64_t skip = skip_elements<float>(state, 3);
  set_num_threads(threads);
  ColdBuffers<float> x(shape.m * shape.k + skip, shape.m * shape.k * 4);
  PlacedBuffer<float> y(shape.m * shape.n, skip != 0);
  int copy = 0;
  const double ops = 2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) *
                     static_cast<double>(shape.k);
  if (kind == kEigen) {
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::setNbThreads(threads);
    const Matrix weight = Matrix::Random(shape.n, shape.k) * 0.02f;
    const Eigen::VectorXf bias = Eigen::VectorXf::Constant(shape.n, 0.5f);
    Eigen::Map<Matrix> out(y.data(), shape.m, shape.n);
    for (auto _ : state) {
      Eigen::Map<const Matrix> in(x.copy(copy++) + skip, shape.m, shape.k);
      out.noalias() = in * weight.transpose();
      out.rowwise() += bias.transpose();
      benchmark::DoNotOptimize(y.data());
    }
    report_flops(state, ops, measured_limits(threads).fma_flops, threads);
  } else if (kind == kDnnl || kind == kDnnlLayer) {
#ifdef DITOPS_BENCH_DNNL
    // s8 activations (quantized beforehand, as oneDNN's int8 matmul takes them) times s8
    // weights with f32 output scales: the GEMM part of a W8A8 layer.
    omp_set_num_threads(threads);  // Debian builds oneDNN on OpenMP
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a_desc({shape.m, shape.k}, dt::s8, tag::ab);
    const dnnl::memory::desc b_any({shape.k, shape.n}, dt::s8, tag::any);
    const dnnl::memory::desc b_plain({shape.k, shape.n}, dt::s8, tag::ba);
    const dnnl::memory::desc c_desc({shape.m, shape.n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_output_scales(2, {DNNL_RUNTIME_F32_VAL});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc, b_any, c_desc), attr, engine);
    std::vector<std::int8_t> a(static_cast<std::size_t>(shape.m * shape.k), 3);
    std::vector<std::int8_t> b(static_cast<std::size_t>(shape.k * shape.n), -5);
    std::vector<float> scales(static_cast<std::size_t>(shape.n), 1e-4f);
    dnnl::memory a_mem(a_desc, engine, a.data()), b_src(b_plain, engine, b.data());
    dnnl::memory b_mem(pd.weights_desc(), engine);
    dnnl::reorder(b_src, b_mem).execute(stream, b_src, b_mem);  // packed once, as ours
    dnnl::memory c_mem(c_desc, engine, y.data());
    dnnl::memory scale_mem({{shape.n}, dt::f32, tag::a}, engine, scales.data());
    const dnnl::matmul matmul(pd);
    // The layer: x (f32) quantized to a by a reorder scaled by 1 / input_scale.
    dnnl::primitive_attr quantize_attr;
    quantize_attr.set_output_scales(0, {1.f / 0.03f});
    const dnnl::memory::desc x_desc({shape.m, shape.k}, dt::f32, tag::ab);
    const dnnl::reorder::primitive_desc quantize_pd(engine, x_desc, engine, a_desc, quantize_attr);
    const dnnl::reorder quantize(quantize_pd);
    for (auto _ : state) {
      if (kind == kDnnlLayer) {
        dnnl::memory x_mem(x_desc, engine, x.copy(copy++) + skip);
        quantize.execute(stream, x_mem, a_mem);
      }
      matmul.execute(stream, {{DNNL_ARG_SRC, a_mem},
                              {DNNL_ARG_WEIGHTS, b_mem},
                              {DNNL_ARG_DST, c_mem},
                              {DNNL_ARG_ATTR_OUTPUT_SCALES, scale_mem}});
      stream.wait();
    }
    report_int8_ops(state, ops, threads);
#else
    state.SkipWithError("built without oneDNN (Debian: libdnnl-dev)");
#endif
  } else {
    const QuantLinear layer = make_layer(kind, shape);
    for (auto _ : state) {
      layer.forward(view(x.copy(copy++) + skip, {shape.m, shape.k}),
                    view(y.data(), {shape.m, shape.n}));
      benchmark::DoNotOptimize(y.data());
    }
    if (kind == kFloat) {
      report_flops(state, ops, measured_limits(threads).fma_flops, threads);
    } else {
      report_int8_ops(state, ops, threads);
      // And against the memory bound: x and the int8 weights read once, y written once
      // (frac_mem; the bound of the thin layers, whose few outputs cost little int8 work).
      report_rate(state, "mem_GB/s", "frac_mem",
                  4.0 * static_cast<double>(shape.m) * static_cast<double>(shape.k + shape.n) +
                      static_cast<double>(shape.n) * static_cast<double>(shape.k),
                  measured_limits(threads).bandwidth, threads);
    }
  }
  state.SetLabel(std::string(kind_name(kind)) + " m" + std::to_string(shape.m) + " k" +
                 std::to_string(shape.k) + " n" + std::to_string(shape.n) + " " + cpu_info().isa +
                 (skip ? " misaligned" : ""));
}

// misaligned = 1: x and y 16 bytes past a cache line, as allocators put them (ditops only).
BENCHMARK(BM_linear)
    ->ArgNames({"shape", "kind", "threads", "misaligned"})
    ->ArgsProduct(
        {{0, 1, 2, 3, 4}, {kDynamic, kStatic, kFloat, kEigen, kDnnl, kDnnlLayer}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// FLUX's MLP, [4608, 3072] -> 12288 -> 3072 (shapes 5 and 6, 4x the work of shape 0 each): the
// W8A8 layers beside oneDNN's, on 2 threads and aligned rows only.
BENCHMARK(BM_linear)
    ->ArgNames({"shape", "kind", "threads", "misaligned"})
    ->ArgsProduct({{5, 6}, {kDynamic, kStatic, kDnnl, kDnnlLayer}, {2}, {0}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- bf16 FLOAT layers --------------------------------------------------------------------------

// A FLOAT layer of bf16 weights (the layers a bf16 model leaves unquantized) at FLUX's sizes:
// [4096 tokens, 3072] -> 3072 (attention projections) and the MLP's 3072 -> 12288 -> 3072.
// BM_linear_bf16: FLOAT layers of bf16 weights at FLUX's shapes (QKV-sized, the MLP's two).
// Kinds: 0 bf16 x -> bf16 y (torch's bf16 linear: on AVX512-BF16 the vdpbf16ps kernel, on AMX
// the TDPBF16PS one; at other levels, e.g. DITOPS_ISA=avx512bw, the weights widened to fp32),
// 1 fp32 x -> fp32 y on the same layer (the pairs widened as they are loaded). frac_peak is of
// the FP32 FMA peak, which vdpbf16ps doubles.
constexpr GemmShape kBf16Shapes[] = {{4096, 3072, 3072}, {4096, 3072, 12288}, {4096, 12288, 3072}};

/// misaligned (range(3)): x and y 16 bytes past a cache line, as allocators put them.
template <class X>
void run_bf16_layer(benchmark::State& state, const QuantLinear& layer, const GemmShape& shape) {
  const std::int64_t skip = skip_elements<X>(state, 3);
  ColdBuffers<X> x(shape.m * shape.k + skip,
                   shape.m * shape.k * static_cast<std::int64_t>(sizeof(X)));
  PlacedBuffer<X> y(shape.m * shape.n, skip != 0);
  int copy = 0;
  for (auto _ : state) {
    layer.forward(view(x.copy(copy++) + skip, {shape.m, shape.k}),
                  view(y.data(), {shape.m, shape.n}));
    benchmark::DoNotOptimize(y.data());
  }
}

void BM_linear_bf16(benchmark::State& state) {
  const GemmShape shape = kBf16Shapes[state.range(0)];
  const bool bf16_x = state.range(1) == 0;
  const int threads = static_cast<int>(state.range(2));
  set_num_threads(threads);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<bf16> weight(static_cast<std::size_t>(shape.n * shape.k));
  for (bf16& w : weight) w = bf16::from_float(normal(rng) * 0.02f);
  const QuantLinear layer = QuantLinear::float_linear(view(weight.data(), {shape.n, shape.k}), {});
  if (bf16_x) {
    run_bf16_layer<bf16>(state, layer, shape);
  } else {
    run_bf16_layer<float>(state, layer, shape);
  }
  report_flops(state,
               2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) *
                   static_cast<double>(shape.k),
               measured_limits(threads).fma_flops, threads);
  state.SetLabel(std::string(bf16_x ? "ditops FLOAT bf16" : "ditops FLOAT bf16 weights f32 x") +
                 " m" + std::to_string(shape.m) + " k" + std::to_string(shape.k) + " n" +
                 std::to_string(shape.n) + " " + cpu_info().isa +
                 (state.range(3) != 0 ? " misaligned" : ""));
}

BENCHMARK(BM_linear_bf16)
    ->ArgNames({"shape", "x_f32", "threads", "misaligned"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {1, 2}, {0}})
    ->Args({0, 0, 2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

/// oneDNN's bf16 matmul of the same shapes (bf16 x, weights packed once in the layout it picks,
/// fp32 accumulation, bf16 y): the peer of BM_linear_bf16/x_f32:0 (on AMX machines oneDNN runs it
/// on tiles itself).
void BM_dnnl_bf16(benchmark::State& state) {
  const GemmShape shape = kBf16Shapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
#ifdef DITOPS_BENCH_DNNL
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  omp_set_num_threads(threads);  // Debian builds oneDNN on OpenMP
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<bf16> weight(static_cast<std::size_t>(shape.n * shape.k));
  for (bf16& w : weight) w = bf16::from_float(normal(rng) * 0.02f);
  ColdBuffers<bf16> x(shape.m * shape.k, shape.m * shape.k * 2);
  PlacedBuffer<bf16> y(shape.m * shape.n, false);
  const dnnl::memory::desc a_desc({shape.m, shape.k}, dt::bf16, tag::ab);
  const dnnl::memory::desc b_any({shape.k, shape.n}, dt::bf16, tag::any);
  const dnnl::memory::desc b_plain({shape.k, shape.n}, dt::bf16, tag::ba);
  const dnnl::memory::desc c_desc({shape.m, shape.n}, dt::bf16, tag::ab);
  // oneDNN has a bf16 matmul only where the CPU has AVX-512 (on AVX2 it finds no
  // implementation and throws): the row is skipped there, as the run goes on.
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_desc, b_any, c_desc), engine);
  } catch (const dnnl::error&) {
    state.SkipWithError("oneDNN has no bf16 matmul for this CPU");
    return;
  }
  dnnl::memory b_src(b_plain, engine, weight.data()), b_mem(pd.weights_desc(), engine);
  dnnl::reorder(b_src, b_mem).execute(stream, b_src, b_mem);  // packed once, as ours
  dnnl::memory c_mem(c_desc, engine, y.data());
  const dnnl::matmul matmul(pd);
  int copy = 0;
  for (auto _ : state) {
    dnnl::memory a_mem(a_desc, engine, x.copy(copy++));
    matmul.execute(stream,
                   {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  }
  report_flops(state,
               2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) *
                   static_cast<double>(shape.k),
               measured_limits(threads).fma_flops, threads);
  state.SetLabel("oneDNN bf16 matmul m" + std::to_string(shape.m) + " k" + std::to_string(shape.k) +
                 " n" + std::to_string(shape.n));
#else
  state.SkipWithError("built without oneDNN (Debian: libdnnl-dev)");
#endif
}

BENCHMARK(BM_dnnl_bf16)
    ->ArgNames({"shape", "threads"})
    ->ArgsProduct({{0, 1, 2}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ditops::bench
