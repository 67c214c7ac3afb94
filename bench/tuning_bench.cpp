// What tuning a new attention shape costs, and what it chooses: for each shape, the first call
// with an empty tuning cache against the median of three steady calls, then every tuner
// candidate timed at full size (a warm-up and the fastest of three runs) to show whether the
// tuner's choice on its slice is the full-size fastest and, where not, what it costs.
// Usage: ditops_tuning_bench [--quick]   (fp32 and bf16, 1 batch, on thread_count() threads;
//        --quick: the small shapes only). One line per shape, then a summary.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <string>
#include <vector>

#include "ops/attention/backends.hpp"
#include "ops/attention/call.hpp"
#include "ops/core/threads.hpp"

namespace {

using namespace ditops;

struct Shape {
  std::int64_t seq_q, seq_k, heads, kv_heads, dim;
  bool causal;
  DType dtype;
};

template <class F>
double seconds_of(F&& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Row {
  double first_over_steady, chosen_over_best;
  bool same;
};

Row measure(const Shape& s) {
  // Float buffers; bf16 tensors use their first half (element strides do not depend on the type).
  std::vector<float> q(s.seq_q * s.heads * s.dim), k(s.seq_k * s.kv_heads * s.dim), v(k.size()),
      out(q.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto* buffer : {&q, &k, &v}) {
    if (s.dtype == DType::f32) {
      for (float& value : *buffer) value = normal(rng);
    } else {
      auto* words = reinterpret_cast<std::uint16_t*>(buffer->data());
      for (std::size_t i = 0; i < buffer->size(); ++i) {
        const float value = normal(rng);
        std::uint32_t bits;
        std::memcpy(&bits, &value, 4);
        words[i] = static_cast<std::uint16_t>(bits >> 16);
      }
    }
  }
  const auto as_view = [&](std::vector<float>& buffer, std::int64_t seq, std::int64_t heads) {
    TensorView t = view(buffer.data(), {1, seq, heads, s.dim});
    t.dtype = s.dtype;
    return t;
  };
  const TensorView qv = as_view(q, s.seq_q, s.heads), kv = as_view(k, s.seq_k, s.kv_heads),
                   vv = as_view(v, s.seq_k, s.kv_heads), ov = as_view(out, s.seq_q, s.heads);
  AttentionOptions options;
  options.causal = s.causal;
  AttentionChoice ran{};
  options.ran = &ran;

  forget_attention_tuning();
  const double first = seconds_of([&] { attention_forward(qv, kv, vv, ov, options); });
  const std::string chosen = ran.detail;
  std::vector<double> steady;
  for (int i = 0; i < 3; ++i) {
    steady.push_back(seconds_of([&] { attention_forward(qv, kv, vv, ov, options); }));
  }

  // Every candidate at full size.
  const attention::Call call = attention::validate_dense("tuning_bench", qv, kv, vv, &ov, options);
  const int threads = core::thread_count();
  const auto candidates = attention::tuning_candidates(call);
  std::string best_name;
  double best = 1e300, chosen_time = 0;
  for (const attention::Config& config : candidates) {
    const auto run = [&] { attention::find_backend(config.backend)->run(call, config, threads); };
    run();
    double fastest = 1e300;
    for (int i = 0; i < 3; ++i) fastest = std::min(fastest, seconds_of(run));
    const std::string name = attention::find_backend(config.backend)->describe(call, config);
    if (fastest < best) {
      best = fastest;
      best_name = name;
    }
    if (chosen.rfind(name + " ", 0) == 0) chosen_time = fastest;
  }
  if (chosen_time == 0) chosen_time = best;  // a single candidate
  const Row row{first / median(steady), chosen_time / best, chosen.rfind(best_name + " ", 0) == 0};
  std::printf("%-44s %6.3f s %6.3f s  %5.2fx  %-36s %-36s %5.3fx\n",
              attention::describe(call).c_str(), first, median(steady), row.first_over_steady,
              chosen.substr(0, chosen.find(" kv_block")).c_str(), best_name.c_str(),
              row.chosen_over_best);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const CpuInfo info = cpu_info();
  std::printf("ditops_tuning_bench: isa %s, %d threads\n", info.isa.c_str(), num_threads());
  std::printf("%-44s %8s %8s %7s %-36s %-36s %6s\n", "call", "first", "steady", "ratio",
              "tuner's choice (slice)", "full-size fastest", "cost");
  // The process's first call pays for its thread team and scratch: not the tuner's cost.
  measure({64, 64, 2, 2, 64, false, DType::f32});
  std::printf("(the line above warms the process up)\n");
  std::vector<Shape> shapes;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const bool causal : {false, true}) {
      for (const std::int64_t seq : {256, 1024, 4096}) {
        shapes.push_back({seq, seq, 24, 24, 128, causal, dtype});
      }
    }
    shapes.push_back({1, 4096, 32, 8, 128, false, dtype});  // decode, GQA
    shapes.push_back({64, 4096, 32, 8, 128, true, dtype});  // chunked prefill, GQA
    shapes.push_back({1536, 1536, 12, 12, 64, false, dtype});
    if (!quick) shapes.push_back({8192, 8192, 24, 24, 128, false, dtype});
  }
  int same = 0;
  double worst_ratio = 0, worst_cost = 1;
  for (const Shape& shape : shapes) {
    const Row row = measure(shape);
    same += row.same;
    worst_ratio = std::max(worst_ratio, row.first_over_steady);
    worst_cost = std::max(worst_cost, row.chosen_over_best);
  }
  std::printf(
      "summary: tuner's choice = full-size fastest in %d of %zu shapes; worst first / "
      "steady %.2fx; worst cost of the choice %.3fx the full-size fastest\n",
      same, shapes.size(), worst_ratio, worst_cost);
}
