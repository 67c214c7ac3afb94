// ditops-rowwise-peer: times rms_norm, add_rms_norm or rotary_position_embedding on one shape for
// tools/bench-peers.sh, which runs the same shape through ONNX Runtime's
// SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization and RotaryEmbedding in turn
// (bench/peers/peers.py). Inputs are N(0, 1); the weight, and RoPE's cos/sin [S, D], are in the
// dtype of x, as ONNX Runtime takes them. One untimed call first, then `--reps` timed calls.
//
// Usage: ditops-rowwise-peer --op rms_norm|add_rms_norm|rope_half|rope_interleaved
//                            --dtype f32|bf16|f16 --rows R --dim D [--heads N] [--threads T]
//                            [--reps R] [--offset BYTES]
//   norms: x is [R, D]; RoPE: x is [1, R, N, D] (R positions of N heads, BSND)
//   --offset: every tensor starts that many bytes past a cache line (default 0; 16 is where
//             malloc and numpy put large arrays)
// Prints one JSON object: {"library": "ditops", "isa": "...", "ms": [...]}.

#include <cmath>
#include <cstdio>
#include <ditops/ditops.hpp>
#include <stdexcept>
#include <string>

#include "bench/peers/peer_support.hpp"

namespace {

using ditops::peers::int_flag;
using ditops::peers::normal_values;

template <class T>
int run(const std::map<std::string, std::string>& flags) {
  const std::string op = ditops::peers::string_flag(flags, "--op", "rms_norm");
  const std::int64_t rows = int_flag(flags, "--rows", 4096), dim = int_flag(flags, "--dim", 3072),
                     heads = int_flag(flags, "--heads", 1), reps = int_flag(flags, "--reps", 1);
  if (rows < 1 || dim < 1 || heads < 1 || reps < 1) {
    throw std::invalid_argument("sizes and --reps must be positive");
  }
  ditops::set_num_threads(static_cast<int>(int_flag(flags, "--threads", 0)));
  const std::int64_t elements = rows * heads * dim;
  const auto offset = static_cast<std::size_t>(int_flag(flags, "--offset", 0));
  auto x = normal_values<T>(elements, offset, 1), residual = normal_values<T>(elements, offset, 2);
  ditops::peers::Buffer<T> out(static_cast<std::size_t>(elements), offset), sum(out.size(), offset);
  ditops::peers::Buffer<T> weight(static_cast<std::size_t>(dim), offset,
                                  ditops::from_float<T>(1.f));
  // RoPE tables of the usual frequencies, cat(f, f) for rotate-half, (f0, f0, f1, f1, ...) else.
  const bool interleaved = op == "rope_interleaved";
  ditops::peers::Buffer<T> cos_table(static_cast<std::size_t>(rows * dim), offset),
      sin_table(cos_table.size(), offset);
  for (std::int64_t s = 0; s < rows && op.rfind("rope", 0) == 0; ++s) {
    for (std::int64_t k = 0; k < dim; ++k) {
      const std::int64_t freq = interleaved ? k / 2 : k % (dim / 2);
      const double angle = static_cast<double>(s) * std::pow(10000.0, -2.0 * freq / dim);
      cos_table[s * dim + k] = ditops::from_float<T>(static_cast<float>(std::cos(angle)));
      sin_table[s * dim + k] = ditops::from_float<T>(static_cast<float>(std::sin(angle)));
    }
  }

  const auto matrix = [&](T* data) { return ditops::view(data, {rows * heads, dim}); };
  const auto heads_view = [&](T* data) { return ditops::view(data, {1, rows, heads, dim}); };
  const auto call = [&] {
    if (op == "rms_norm") {
      ditops::rms_norm(matrix(x.data()), ditops::view(weight.data(), {dim}), 1e-6f,
                       matrix(out.data()));
    } else if (op == "add_rms_norm") {
      ditops::add_rms_norm(matrix(x.data()), matrix(residual.data()),
                           ditops::view(weight.data(), {dim}), 1e-6f, matrix(out.data()),
                           matrix(sum.data()));
    } else if (op == "rope_half" || interleaved) {
      ditops::rotary_position_embedding(
          heads_view(x.data()), ditops::view(cos_table.data(), {rows, dim}),
          ditops::view(sin_table.data(), {rows, dim}), heads_view(out.data()),
          interleaved ? ditops::RotatedMode::rotated_interleaved
                      : ditops::RotatedMode::rotated_half);
    } else {
      throw std::invalid_argument("unknown --op '" + op + "'");
    }
  };
  call();
  std::printf("{\"library\": \"ditops\", \"isa\": \"%s\", ", ditops::cpu_info().isa.c_str());
  ditops::peers::print_timed_calls(reps, call);
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto flags = ditops::peers::parse_flags(argc, argv);
    const std::string dtype = ditops::peers::string_flag(flags, "--dtype", "f32");
    if (dtype == "f32") return run<float>(flags);
    if (dtype == "bf16") return run<ditops::bf16>(flags);
    if (dtype == "f16") return run<ditops::f16>(flags);
    throw std::invalid_argument("--dtype must be f32, bf16 or f16");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ditops-rowwise-peer: %s\n", error.what());
    return 2;
  }
}
