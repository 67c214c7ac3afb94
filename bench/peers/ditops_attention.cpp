// ditops-attention-peer: times attention_forward on one shape for tools/bench-peers.sh, which
// runs the same shape in PyTorch and ONNX Runtime in turn (bench/peers/peers.py). Inputs are
// N(0, 1) BSND fp32 tensors, as the Python peers make them; one untimed call first (it tunes
// and warms the caches), then `--reps` timed calls.
//
// Usage: ditops-attention-peer --seq S --heads N --dim D [--batch B] [--causal 0|1]
//                              [--threads T] [--reps R] [--dtype f32|bf16] [--backend NAME]
//                              [--offset BYTES]
//   --offset: q, k, v and out start that many bytes past a cache line (default 0; 16 is where
//             malloc and numpy put large arrays)
// Prints one JSON object: {"library": "ditops", "backend": "...", "detail": "...", "isa": "...",
// "ms": [...]} (detail: the tuner's tile choice).

#include <cstdio>
#include <ditops/ditops.hpp>
#include <stdexcept>
#include <string>

#include "bench/peers/peer_support.hpp"

namespace {

using ditops::peers::int_flag;
using ditops::peers::normal_values;

ditops::AttentionBackend parse_backend(const std::string& name) {
  for (auto backend : {ditops::AttentionBackend::automatic, ditops::AttentionBackend::reference,
                       ditops::AttentionBackend::flash, ditops::AttentionBackend::flash_bf16,
                       ditops::AttentionBackend::int8}) {
    if (name == ditops::backend_name(backend)) return backend;
  }
  throw std::invalid_argument("unknown --backend '" + name + "'");
}

template <class T>
int run(const std::map<std::string, std::string>& args) {
  const auto get = [&](const char* key, std::int64_t fallback) {
    return int_flag(args, key, fallback);
  };
  const std::int64_t batch = get("--batch", 1), seq = get("--seq", 2048),
                     heads = get("--heads", 24), dim = get("--dim", 128), reps = get("--reps", 1);
  if (batch < 1 || seq < 1 || heads < 1 || dim < 1 || reps < 1) {
    throw std::invalid_argument("sizes and --reps must be positive");
  }
  ditops::set_num_threads(static_cast<int>(get("--threads", 0)));
  ditops::AttentionOptions options;
  options.causal = get("--causal", 0) != 0;
  const auto backend = args.find("--backend");
  if (backend != args.end()) options.backend = parse_backend(backend->second);

  const std::int64_t elements = batch * seq * heads * dim;
  const auto offset = static_cast<std::size_t>(get("--offset", 0));
  auto q = normal_values<T>(elements, offset, 1), k = normal_values<T>(elements, offset, 2),
       v = normal_values<T>(elements, offset, 3);
  ditops::peers::Buffer<T> out(static_cast<std::size_t>(elements), offset);
  const auto shape = [&](T* data) { return ditops::view(data, {batch, seq, heads, dim}); };
  const ditops::AttentionChoice choice =
      ditops::select_attention(shape(q.data()), shape(k.data()), shape(v.data()), options);
  ditops::attention_forward(shape(q.data()), shape(k.data()), shape(v.data()), shape(out.data()),
                            options);
  std::printf(
      "{\"library\": \"ditops\", \"backend\": \"%s\", \"detail\": \"%s\", \"isa\": \"%s\", ",
      ditops::backend_name(choice.backend), choice.detail.c_str(), ditops::cpu_info().isa.c_str());
  ditops::peers::print_timed_calls(reps, [&] {
    ditops::attention_forward(shape(q.data()), shape(k.data()), shape(v.data()), shape(out.data()),
                              options);
  });
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto args = ditops::peers::parse_flags(argc, argv);
    const auto dtype = args.find("--dtype");
    if (dtype == args.end() || dtype->second == "f32") return run<float>(args);
    if (dtype->second == "bf16") return run<ditops::bf16>(args);
    throw std::invalid_argument("--dtype must be f32 or bf16");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ditops-attention-peer: %s\n", error.what());
    return 2;
  }
}
