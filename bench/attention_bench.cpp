// Attention: flash (fp32) and flash_bf16 beside the reference backend (Eigen GEMMs with
// materialized scores) in the same process. Shapes: FLUX-like self-attention (B=1, N=24,
// D=128, S=2048 and 4608, non-causal and causal), a Wan-like long sequence (S=16384, N=4),
// GQA decode-like calls (Sq 1 and 16 against Sk=8192, 32/8 heads) and a varlen batch of 8
// mixed lengths beside the sum of its per-sequence dense runs.
// The int8 backend beside flash fp32 on the FLUX shapes, chunk 1/2/4.
// FLOPs: 4·B·N·Sq·Sk·D (Q·K^T and P·V), halved for causal.

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

struct Shape {
  const char* name;
  std::int64_t batch, q_len, kv_len, heads, kv_heads, dim;
  bool causal;
};
const Shape kShapes[] = {
    {"flux_s2048", 1, 2048, 2048, 24, 24, 128, false},
    {"flux_s2048_causal", 1, 2048, 2048, 24, 24, 128, true},
    {"flux_s4608", 1, 4608, 4608, 24, 24, 128, false},
    {"flux_s4608_causal", 1, 4608, 4608, 24, 24, 128, true},
    {"wan_s16384_n4", 1, 16384, 16384, 4, 4, 128, false},
    {"gqa_decode_sq1_sk8192", 1, 1, 8192, 32, 8, 128, false},
    {"gqa_decode_sq16_sk8192", 1, 16, 8192, 32, 8, 128, false},
};

double attention_flops(const Shape& s) {
  const double flops = 4.0 * s.batch * s.heads * s.q_len * s.kv_len * s.dim;
  return s.causal ? flops / 2 : flops;
}

/// Normal q, k, v and an output of a shape, BSND, with their views; every tensor on a cache
/// line, or 16 bytes past one (misaligned).
template <class T>
struct AttentionInputs {
  PlacedBuffer<T> q, k, v, out;
  TensorView qv, kv, vv, ov;
  AttentionInputs(const Shape& s, bool misaligned)
      : q(normal_buffer<T>(s.batch * s.q_len * s.heads * s.dim, misaligned, 1)),
        k(normal_buffer<T>(s.batch * s.kv_len * s.kv_heads * s.dim, misaligned, 2)),
        v(normal_buffer<T>(s.batch * s.kv_len * s.kv_heads * s.dim, misaligned, 3)),
        out(static_cast<std::int64_t>(q.size()), misaligned) {
    qv = view(q.data(), {s.batch, s.q_len, s.heads, s.dim});
    kv = view(k.data(), {s.batch, s.kv_len, s.kv_heads, s.dim});
    vv = view(v.data(), {s.batch, s.kv_len, s.kv_heads, s.dim});
    ov = view(out.data(), {s.batch, s.q_len, s.heads, s.dim});
  }
};

/// range(0): shape; range(1): threads; range(2): eigen = 1 runs the reference backend (the
/// same-process baseline bench-summary pairs with eigen:0); range(3): misaligned tensors.
template <class T, AttentionBackend kBackend>
void BM_attention(benchmark::State& state) {
  const Shape s = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const bool reference = state.range(2) != 0, misaligned = state.range(3) != 0;
  set_num_threads(threads);
  AttentionInputs<T> in(s, misaligned);
  AttentionOptions options;
  options.causal = s.causal;
  options.backend = reference ? AttentionBackend::reference : kBackend;
  for (auto _ : state) {
    attention_forward(in.qv, in.kv, in.vv, in.ov, options);
    benchmark::ClobberMemory();
  }
  const Limits& limits = measured_limits(threads);
  const bool bf16_peak = kBackend == AttentionBackend::flash_bf16 && !reference;
  state.SetLabel(std::string(s.name) + " " + backend_name(options.backend) + " " +
                 dtype_name(detail::dtype_of<T>()) + placement_label(misaligned));
  report_flops(state, attention_flops(s),
               bf16_peak && limits.bf16_flops > 0 ? limits.bf16_flops : limits.fma_flops, threads);
}

/// Varlen: 8 sequences of mixed lengths (sum 8192) in one packed call (dense = 0), or the
/// same sequences as 8 dense calls (dense = 1). N=24, D=128, non-causal. range(2): misaligned.
void BM_attention_varlen(benchmark::State& state) {
  const bool dense = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  const bool misaligned = state.range(2) != 0;
  set_num_threads(threads);
  const std::vector<std::int32_t> lengths = {2048, 256, 1024, 77, 1536, 512, 2300, 439};
  constexpr std::int64_t kHeads = 24, kDim = 128;
  std::vector<std::int32_t> cu{0};
  for (auto len : lengths) cu.push_back(cu.back() + len);
  const std::int64_t total = cu.back();
  auto q = normal_buffer<float>(total * kHeads * kDim, misaligned, 1);
  auto k = normal_buffer<float>(total * kHeads * kDim, misaligned, 2);
  auto v = normal_buffer<float>(total * kHeads * kDim, misaligned, 3);
  PlacedBuffer<float> out(static_cast<std::int64_t>(q.size()), misaligned);
  double flops = 0;
  for (auto len : lengths) flops += 4.0 * kHeads * double(len) * len * kDim;
  for (auto _ : state) {
    if (dense) {
      for (std::size_t i = 0; i < lengths.size(); ++i) {
        const std::int64_t offset = cu[i] * kHeads * kDim, len = lengths[i];
        AttentionOptions options;
        options.backend = AttentionBackend::flash;
        attention_forward(view(q.data() + offset, {1, len, kHeads, kDim}),
                          view(k.data() + offset, {1, len, kHeads, kDim}),
                          view(v.data() + offset, {1, len, kHeads, kDim}),
                          view(out.data() + offset, {1, len, kHeads, kDim}), options);
      }
    } else {
      VarlenOptions options;
      options.backend = AttentionBackend::flash;
      attention_forward_varlen(view(q.data(), {total, kHeads, kDim}),
                               view(k.data(), {total, kHeads, kDim}),
                               view(v.data(), {total, kHeads, kDim}), cu, cu,
                               view(out.data(), {total, kHeads, kDim}), options);
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(dense ? "varlen8 as 8 dense calls" : "varlen8 packed") +
                 placement_label(misaligned));
  report_flops(state, flops, measured_limits(threads).fma_flops, threads);
}

// misaligned = 1: q, k, v and out 16 bytes past a cache line, as allocators put them (FLUX
// S = 2048 and decode, beside their aligned rows).
void flash_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "eigen", "misaligned"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int shape = 0; shape < 7; ++shape) {
    for (int threads : {1, 2}) {
      b->Args({shape, threads, 0, 0});
      if (shape == 0 || shape == 5) b->Args({shape, threads, 0, 1});
    }
  }
  // Reference baselines (slow: materialized scores) on the quick FLUX shapes and decode.
  for (int shape : {0, 1, 5, 6}) b->Args({shape, 2, 1, 0});
}

void bf16_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "eigen", "misaligned"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int shape : {0, 1, 2, 5}) {
    for (int threads : {1, 2}) {
      b->Args({shape, threads, 0, 0});
      if (shape == 0) b->Args({shape, threads, 0, 1});
    }
  }
}

/// int8 backend (range(2) = chunk) against flash fp32 on the same inputs (range(3) = flash = 1,
/// reported with chunk 0: the same-process baseline bench-summary pairs with flash:0);
/// range(4): misaligned tensors. K has
/// per-channel offsets, as real models' keys do (the case smoothing exists for). Rate: int8
/// operations (2 per multiply-add of Q·K^T and P·V) against the measured int8 peak; accuracy:
/// cosine similarity and relative L2 error of the output against flash fp32's.
void BM_attention_int8(benchmark::State& state) {
  const Shape s = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const bool flash = state.range(3) != 0, misaligned = state.range(4) != 0;
  set_num_threads(threads);
  AttentionInputs<float> in(s, misaligned);
  for (std::size_t i = 0; i < in.k.size(); ++i) in.k[i] += static_cast<float>(i % s.dim % 7) - 3.f;
  AttentionOptions options;
  options.causal = s.causal;
  options.backend = flash ? AttentionBackend::flash : AttentionBackend::int8;
  options.int8_chunk = flash ? 2 : static_cast<int>(state.range(2));
  for (auto _ : state) {
    attention_forward(in.qv, in.kv, in.vv, in.ov, options);
    benchmark::ClobberMemory();
  }
  if (!flash) {  // accuracy at this shape, against flash fp32 (outside the timed loop)
    const PlacedBuffer<float>& out = in.out;
    std::vector<float> exact(out.size());
    AttentionOptions fp32 = options;
    fp32.backend = AttentionBackend::flash;
    attention_forward(in.qv, in.kv, in.vv, view(exact.data(), {s.batch, s.q_len, s.heads, s.dim}),
                      fp32);
    double dot = 0, got2 = 0, want2 = 0, diff2 = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      dot += double(out[i]) * exact[i];
      got2 += double(out[i]) * out[i];
      want2 += double(exact[i]) * exact[i];
      diff2 += (double(out[i]) - exact[i]) * (double(out[i]) - exact[i]);
    }
    state.counters["cos_vs_fp32"] = dot / std::sqrt(got2 * want2);
    state.counters["rel_l2_vs_fp32"] = std::sqrt(diff2 / want2);
  }
  state.SetLabel(std::string(s.name) + " " + backend_name(options.backend) +
                 (flash ? "" : " chunk " + std::to_string(options.int8_chunk)) +
                 placement_label(misaligned));
  if (flash) {
    report_flops(state, attention_flops(s), measured_limits(threads).fma_flops, threads);
  } else {
    report_int8_ops(state, attention_flops(s), threads);
  }
}

void int8_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "chunk", "flash", "misaligned"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int shape : {0, 2, 1}) {
    for (int threads : {1, 2}) {
      for (int chunk : {1, 2, 4}) b->Args({shape, threads, chunk, 0, 0});
      b->Args({shape, threads, 0, 1, 0});
      if (shape == 0) b->Args({shape, threads, 2, 0, 1});
    }
  }
}

BENCHMARK_TEMPLATE(BM_attention, float, AttentionBackend::flash)
    ->Name("attention_flash_f32")
    ->Apply(flash_args);
BENCHMARK_TEMPLATE(BM_attention, bf16, AttentionBackend::flash_bf16)
    ->Name("attention_flash_bf16")
    ->Apply(bf16_args);
BENCHMARK(BM_attention_int8)->Name("attention_int8")->Apply(int8_args);
BENCHMARK(BM_attention_varlen)
    ->ArgNames({"dense", "threads", "misaligned"})
    ->ArgsProduct({{0, 1}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ditops::bench
