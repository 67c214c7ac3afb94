// attention_forward (every backend: forced by options, automatic through DITOPS_ATTN_BACKEND, the
// tuner behind a refused one), attention_forward_varlen and
// select_attention over their argument space: dtypes, both layouts, GQA, Dk != Dv, causal,
// strided rows, boolean and additive masks in every broadcast form (with -inf, -FLT_MAX, 2^126,
// +inf and NaN elements), LSE, scales up to and past the limit, int8 chunks, cu_seqlens,
// invalid enums and broken views. Accepted calls are checked against the fp64 reference.

#include <ditops/attention.hpp>
#include <optional>

#include "fuzz/support.hpp"
#include "tests/reference/attention_ref.hpp"
#include "tests/support/scoped_env.hpp"

namespace ditops::fuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Beyond this scale the softmax of normal inputs is nearly a hard maximum, where fp32 rounding
// of near-tied scores moves the weights by more than any tolerance: accepted, not compared.
constexpr float kComparedScale = 4.f;

AttentionBackend pick_backend(Input& in) {
  if (in.rarely(32)) return static_cast<AttentionBackend>(in.size(6, 300));  // not an enum value
  return in.pick({AttentionBackend::reference, AttentionBackend::flash,
                  AttentionBackend::flash_bf16, AttentionBackend::int8, AttentionBackend::sparse,
                  AttentionBackend::flash, AttentionBackend::int8, AttentionBackend::automatic});
}

/// Where the harness resolves an `automatic` call: tuning would time every candidate inside the
/// input (seven runs each on a cache miss), so the harness names a backend that accepts every
/// call in DITOPS_ATTN_BACKEND, for this call only, and the library runs it untimed through the
/// variable's path. Cached and tuned choices are tune_cache_fuzz's subject.
void resolve_automatic(Input& in, AttentionBackend requested, std::optional<test::ScopedEnv>& env) {
  if (requested != AttentionBackend::automatic) return;
  const AttentionBackend backend =
      in.pick({AttentionBackend::flash, AttentionBackend::flash_bf16, AttentionBackend::reference});
  env.emplace("DITOPS_ATTN_BACKEND", backend_name(backend));
}

/// The sparse backend refuses calls without a boolean mask (and varlen ones), and a refused
/// forced backend falls back to the tuner, which times its candidates: such a pick stays sparse
/// in 1 of 8 calls (the refusal and its fallback are still covered), else it becomes flash.
void keep_sparse_refusals_rare(Input& in, AttentionBackend& requested, bool boolean_mask) {
  if (requested == AttentionBackend::sparse && !boolean_mask && !in.rarely(8)) {
    requested = AttentionBackend::flash;
  }
}

std::optional<float> pick_scale(Input& in) {
  if (!in.rarely(4)) return std::nullopt;
  return in.pick({0.f, 1.f}) == 0.f ? in.edge_float(0.3f) : in.pick({65536.f, 65537.f, 1e-30f});
}

bool scale_in_range(const std::optional<float>& scale) {
  return !scale || (std::isfinite(*scale) && *scale > 0.f && *scale <= 65536.f);
}

/// A bias: mostly normal, sometimes one of the values the range rule is about.
float pick_bias(Input& in, std::mt19937& rng, Normal& normal) {
  if (!in.rarely(6)) return normal(rng);
  return in.pick({-kInf, -FLT_MAX, -0x1p127f, 0x1p126f, 0x1p127f, kInf,
                  std::numeric_limits<float>::quiet_NaN()});
}

void check_lse(const TestTensor<float>& lse, const test::AttentionRefResult& ref,
               double lse_tolerance, const std::string& context) {
  for (std::int64_t i = 0; i < lse.size(); ++i) {
    const double want = ref.lse[static_cast<std::size_t>(i)], got = lse.value(i);
    const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= lse_tolerance;
    if (!ok) {
      failure(context + ": lse " + std::to_string(i) + " is " + std::to_string(got) +
              ", the reference " + std::to_string(want) + ", tolerance " +
              std::to_string(lse_tolerance) + " (scores up to " +
              std::to_string(ref.magnitudes.score_l1) + " in l1, " +
              std::to_string(ref.magnitudes.score_l2) + " in l2)");
    }
  }
}

/// int8 is lossy by design (its accuracy is tests/attention/int8_test.cpp's subject): an output
/// is a convex combination of V rows, so |out| stays within max |v| up to the V quantization.
template <class T>
void expect_within_v(const TestTensor<T>& out, const TestTensor<T>& v, const std::string& context) {
  double v_max = 0;
  for (std::int64_t i = 0; i < v.size(); ++i) v_max = std::max(v_max, std::fabs(v.value(i)));
  for (std::int64_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(out.value(i)) <= v_max * 1.02 + 1e-3)) {
      failure(context + ": int8 output " + std::to_string(i) + " is " +
              std::to_string(out.value(i)) + ", beyond max |v| " + std::to_string(v_max));
    }
  }
}

template <class T>
void dense(Input& in) {
  const std::int64_t b = in.size(0, 2), kv_heads = in.size(1, 2), n = kv_heads * in.size(1, 3);
  const bool long_kv = in.rarely(8);  // the split-KV path: few tasks, >= 8 KV blocks
  const std::int64_t sq = long_kv ? in.size(1, 3) : in.size(0, 24);
  const std::int64_t sk = long_kv ? in.size(449, 600) : in.size(0, 70);
  const std::int64_t dk = in.rarely(8) ? in.size(1, 80) : in.size(1, 24);
  const std::int64_t dv = in.flag() ? dk : in.size(1, 24);
  const bool head_first = in.flag();
  auto shape = [&](std::int64_t s, std::int64_t heads, std::int64_t d) {
    return test::attention_shape(head_first, b, s, heads, d);
  };
  TestTensor<T> q(shape(sq, n, dk), in.size(0, 2)), k(shape(sk, kv_heads, dk), in.size(0, 2)),
      v(shape(sk, kv_heads, dv), in.size(0, 2)), out(shape(sq, n, dv), in.size(0, 2));
  TestTensor<float> lse({b, n, sq});
  std::mt19937 rng(in.seed());
  const bool specials = in.rarely(8);
  fill(q, rng, specials && in.flag());
  fill(k, rng, specials && in.flag());
  fill(v, rng, specials && in.flag());

  AttentionOptions options;
  options.causal = in.flag();
  options.head_first = head_first;
  options.scale = pick_scale(in);
  options.backend = pick_backend(in);
  std::optional<test::ScopedEnv> forced_by_env;  // until the call returns
  resolve_automatic(in, options.backend, forced_by_env);
  AttentionChoice ran{};
  options.ran = &ran;
  options.int8_chunk = in.rarely(32) ? static_cast<int>(in.size(-1, 8)) : in.pick({1, 2, 4});
  if (in.flag()) options.lse = lse.view();

  // Mask: none, boolean or additive; rank 2 [Sq, Sk] or rank 4 with any dimension broadcast.
  const int mask_kind = static_cast<int>(in.size(0, 2));
  keep_sparse_refusals_rare(in, options.backend, mask_kind == 1);
  std::vector<std::int64_t> mask_shape = {sq, sk};
  if (in.flag()) {
    mask_shape = {in.flag() ? b : 1, in.flag() ? n : 1, in.flag() ? sq : 1, sk};
  }
  TestTensor<std::uint8_t> bool_mask(mask_shape);
  TestTensor<float> float_mask(mask_shape);
  bool bias_out_of_range = false, bias_nan = false;
  for (std::int64_t i = 0; i < bool_mask.size(); ++i) bool_mask.at(i) = chance(rng, 0.7f);
  Normal normal;
  for (std::int64_t i = 0; i < float_mask.size(); ++i) {
    const float bias = pick_bias(in, rng, normal);
    float_mask.at(i) = bias;
    bias_out_of_range |= bias > 0x1p126f;
    bias_nan |= std::isnan(bias);
  }
  if (mask_kind == 1) options.attn_mask = test::as_bool(bool_mask.view());
  if (mask_kind == 2) options.attn_mask = float_mask.view();

  // Now and then a broken argument: each must be an Error before anything is written.
  TensorView q_view = q.view(), k_view = k.view(), v_view = v.view(), out_view = out.view();
  const int broken = in.rarely(8) ? static_cast<int>(in.size(1, 7)) : 0;
  switch (broken) {
    case 1:
      out_view = q_view;  // aliasing an input (or a dtype/shape mismatch)
      break;
    case 2:
      k_view.shape[3] += 1;
      break;
    case 3:
      out_view.strides[in.size(0, 2)] = 0;  // output elements sharing memory
      break;
    case 4:
      v_view.data = nullptr;
      break;
    case 5:
      q_view.strides[3] = 2;  // last dimension not contiguous
      break;
    case 6:
      k_view.shape[head_first ? 1 : 2] = 0;  // no KV heads
      break;
    case 7:
      options.lse = out.view();  // wrong rank and dtype
      break;
  }
  const auto out_before = out.snapshot();
  const auto lse_before = lse.snapshot();
  const bool ok = accepted([&] { attention_forward(q_view, k_view, v_view, out_view, options); });
  // What ran decides the tolerance: a refused forced backend runs the tuned choice.
  const std::string context =
      std::string("attention_forward ") + dtype_name(q.view().dtype) + " [" + std::to_string(b) +
      ", " + std::to_string(sq) + "/" + std::to_string(sk) + ", " + std::to_string(n) + "/" +
      std::to_string(kv_heads) + ", " + std::to_string(dk) + "/" + std::to_string(dv) + "] mask " +
      std::to_string(mask_kind) + (options.causal ? " causal" : "") + " scale " +
      std::to_string(options.scale.value_or(0.f)) + " asked for " + backend_name(options.backend) +
      ", ran " + (ok ? ran.detail : "nothing");
  if (!ok) {
    expect_unchanged(out, out_before, context + " out");
    expect_unchanged(lse, lse_before, context + " lse");
    return;
  }
  expect_canaries(out, context + " out");
  expect_canaries(lse, context + " lse");
  if (broken != 0) return;
  if (!scale_in_range(options.scale)) failure(context + ": accepted an out-of-range scale");
  if (mask_kind == 2 && bias_out_of_range) failure(context + ": accepted a bias above 2^126");
  if (specials || (mask_kind == 2 && bias_nan)) return;  // non-finite data: canaries only
  if (options.scale && *options.scale > kComparedScale) return;
  if (ran.backend == AttentionBackend::int8) return expect_within_v(out, v, context);

  test::AttentionRefProblem p;
  p.batch = b;
  p.q_len = sq;
  p.kv_len = sk;
  p.heads = n;
  p.kv_heads = kv_heads;
  p.dk = dk;
  p.dv = dv;
  p.scale = options.scale.value_or(1.f / std::sqrt(float(dk)));
  p.causal = options.causal;
  auto index = [&](std::int64_t bi, std::int64_t s, std::int64_t h, std::int64_t d,
                   std::int64_t len, std::int64_t heads, std::int64_t dim) {
    return test::attention_index(head_first, bi, s, h, d, len, heads, dim);
  };
  p.q = [&](auto bi, auto s, auto h, auto d) { return q.value(index(bi, s, h, d, sq, n, dk)); };
  p.k = [&](auto bi, auto s, auto h, auto d) {
    return k.value(index(bi, s, h, d, sk, kv_heads, dk));
  };
  p.v = [&](auto bi, auto s, auto h, auto d) {
    return v.value(index(bi, s, h, d, sk, kv_heads, dv));
  };
  auto mask_index = [&](std::int64_t bi, std::int64_t h, std::int64_t i, std::int64_t j) {
    if (mask_shape.size() == 2) return i * sk + j;
    const std::int64_t mb = mask_shape[0] == 1 ? 0 : bi, mh = mask_shape[1] == 1 ? 0 : h,
                       mi = mask_shape[2] == 1 ? 0 : i;
    return ((mb * mask_shape[1] + mh) * mask_shape[2] + mi) * sk + j;
  };
  if (mask_kind == 1) {
    p.allowed = [&](auto bi, auto h, auto i, auto j) {
      return bool_mask.at(mask_index(bi, h, i, j)) != 0;
    };
  }
  if (mask_kind == 2) {
    p.allowed = [&](auto bi, auto h, auto i, auto j) {
      return float_mask.at(mask_index(bi, h, i, j)) != -kInf;
    };
    p.bias = [&](auto bi, auto h, auto i, auto j) {
      return double(float_mask.at(mask_index(bi, h, i, j)));
    };
  }
  const test::AttentionRefResult ref = test::attention_reference(p);
  std::vector<double> expected(static_cast<std::size_t>(out.size()));
  for (std::int64_t bi = 0; bi < b; ++bi) {
    for (std::int64_t s = 0; s < sq; ++s) {
      for (std::int64_t h = 0; h < n; ++h) {
        for (std::int64_t d = 0; d < dv; ++d) {
          expected[index(bi, s, h, d, sq, n, dv)] = ref.at(p, bi, s, h, d);
        }
      }
    }
  }
  check_close(out, expected, test::attention_tolerance<T>(ran.backend, ref.magnitudes), context);
  if (options.lse.data == lse.view().data) {
    check_lse(lse, ref, test::attention_lse_tolerance(ran.backend, ref.magnitudes), context);
  }
  if (in.rarely(8)) {
    const AttentionChoice choice = select_attention(q_view, k_view, v_view, options);
    if (backend_name(choice.backend) == std::string("unknown") || choice.detail.empty()) {
      failure(context + ": select_attention returned no backend");
    }
  }
}

template <class T>
void varlen(Input& in) {
  const std::int64_t batch = in.size(0, 3), kv_heads = in.size(1, 2), n = kv_heads * in.size(1, 2);
  const std::int64_t dk = in.size(1, 24), dv = in.flag() ? dk : in.size(1, 24);
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
  for (std::int64_t s = 0; s < batch; ++s) {
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(in.size(0, 20)));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(in.size(0, 70)));
  }
  const std::int64_t tq = cu_q.back(), tk = cu_k.back();
  TestTensor<T> q({tq, n, dk}, in.size(0, 2)), k({tk, kv_heads, dk}), v({tk, kv_heads, dv}),
      out({tq, n, dv}, in.size(0, 2));
  TestTensor<float> lse({n, tq});
  std::mt19937 rng(in.seed());
  const bool specials = in.rarely(8);
  fill(q, rng, specials);
  fill(k, rng);
  fill(v, rng);
  VarlenOptions options;
  options.causal = in.flag();
  options.scale = pick_scale(in);
  options.backend = pick_backend(in);
  std::optional<test::ScopedEnv> forced_by_env;  // until the call returns
  resolve_automatic(in, options.backend, forced_by_env);
  keep_sparse_refusals_rare(in, options.backend, false);  // varlen calls it refuses
  AttentionChoice ran{};
  options.ran = &ran;
  if (in.flag()) options.lse = lse.view();
  bool broken = false;
  if (in.rarely(6)) {  // offsets that do not describe the tensors
    broken = true;
    auto& cu = in.flag() ? cu_q : cu_k;
    cu[static_cast<std::size_t>(in.size(0, static_cast<std::int64_t>(cu.size()) - 1))] +=
        static_cast<std::int32_t>(in.pick({-1, 1, -1000, 1 << 30}));
    if (in.rarely(4)) cu.clear();
    // One offset too many (after a clear, cu_q has no last offset to repeat).
    if (in.rarely(4)) cu_q.push_back(cu_q.empty() ? 0 : cu_q.back());
  }
  const auto out_before = out.snapshot();
  const bool ok = accepted([&] {
    attention_forward_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), options);
  });
  const std::string context =
      std::string("attention_forward_varlen ") + dtype_name(q.view().dtype) + " asked for " +
      backend_name(options.backend) + ", ran " + (ok ? ran.detail : "nothing");
  if (!ok) return expect_unchanged(out, out_before, context);
  expect_canaries(out, context + " out");
  expect_canaries(lse, context + " lse");
  if (broken && (cu_q.size() != cu_k.size() || cu_q.empty() || cu_q.front() != 0 ||
                 cu_q.back() != tq || cu_k.back() != tk)) {
    failure(context + ": accepted offsets that do not describe q and k");
  }
  if (broken || specials || !scale_in_range(options.scale)) {
    if (!scale_in_range(options.scale)) failure(context + ": accepted an out-of-range scale");
    return;
  }
  if (options.scale && *options.scale > kComparedScale) return;
  if (ran.backend == AttentionBackend::int8) return expect_within_v(out, v, context);
  // Each sequence against the oracle on its own.
  std::vector<double> expected(static_cast<std::size_t>(out.size()));
  test::AttentionMagnitudes magnitudes;
  for (std::size_t s = 0; s + 1 < cu_q.size(); ++s) {
    const std::int64_t q0 = cu_q[s], k0 = cu_k[s];
    test::AttentionRefProblem p;
    p.q_len = cu_q[s + 1] - q0;
    p.kv_len = cu_k[s + 1] - k0;
    p.heads = n;
    p.kv_heads = kv_heads;
    p.dk = dk;
    p.dv = dv;
    p.scale = options.scale.value_or(1.f / std::sqrt(float(dk)));
    p.causal = options.causal;
    p.q = [&](auto, auto i, auto h, auto d) { return q.value(((q0 + i) * n + h) * dk + d); };
    p.k = [&](auto, auto j, auto h, auto d) { return k.value(((k0 + j) * kv_heads + h) * dk + d); };
    p.v = [&](auto, auto j, auto h, auto d) { return v.value(((k0 + j) * kv_heads + h) * dv + d); };
    const test::AttentionRefResult ref = test::attention_reference(p);
    magnitudes.include(ref.magnitudes);
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      for (std::int64_t h = 0; h < n; ++h) {
        for (std::int64_t d = 0; d < dv; ++d) {
          expected[((q0 + i) * n + h) * dv + d] = ref.at(p, 0, i, h, d);
        }
      }
    }
  }
  check_close(out, expected, test::attention_tolerance<T>(ran.backend, magnitudes), context);
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  fuzz::set_threads(in);
  // Nothing carries over from one input to the next: choices tuned for earlier inputs (timed
  // under whatever load there was) are forgotten; DITOPS_TUNE_CACHE, where set, is read again.
  forget_attention_tuning();
  const bool packed = in.rarely(4);
  switch (in.size(0, 2)) {
    case 0:
      packed ? fuzz::varlen<float>(in) : fuzz::dense<float>(in);
      break;
    case 1:
      packed ? fuzz::varlen<bf16>(in) : fuzz::dense<bf16>(in);
      break;
    default:
      packed ? fuzz::varlen<f16>(in) : fuzz::dense<f16>(in);
  }
  return 0;
}
