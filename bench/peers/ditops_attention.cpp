// ditops-attention-peer: times attention_forward on one shape for tools/bench-peers.sh, which
// runs the same shape in PyTorch and ONNX Runtime in turn (bench/peers/peers.py). Inputs are
// N(0, 1) BSND fp32 tensors, as the Python peers make them; one untimed call first (it tunes
// and warms the caches), then `--reps` timed calls.
//
// Usage: ditops-attention-peer --seq S --heads N --dim D [--batch B] [--causal 0|1]
//                              [--threads T] [--reps R] [--dtype f32|bf16] [--backend NAME]
// Prints one JSON object: {"library": "ditops", "backend": "...", "detail": "...", "isa": "...",
// "ms": [...]} (detail: the tuner's tile choice).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ditops/ditops.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

template <class T>
std::vector<T> normal_values(std::int64_t count, unsigned seed) {
  std::vector<T> values(static_cast<std::size_t>(count));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& value : values) {
    if constexpr (std::is_same_v<T, float>) {
      value = normal(rng);
    } else {
      value = T::from_float(normal(rng));
    }
  }
  return values;
}

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
  auto get = [&](const char* key, std::int64_t fallback) {
    const auto it = args.find(key);
    return it == args.end() ? fallback : std::stoll(it->second);
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
  auto q = normal_values<T>(elements, 1), k = normal_values<T>(elements, 2),
       v = normal_values<T>(elements, 3);
  std::vector<T> out(static_cast<std::size_t>(elements));
  const auto shape = [&](T* data) { return ditops::view(data, {batch, seq, heads, dim}); };
  const ditops::AttentionChoice choice =
      ditops::select_attention(shape(q.data()), shape(k.data()), shape(v.data()), options);
  ditops::attention_forward(shape(q.data()), shape(k.data()), shape(v.data()), shape(out.data()),
                            options);
  std::printf(
      "{\"library\": \"ditops\", \"backend\": \"%s\", \"detail\": \"%s\", \"isa\": \"%s\", "
      "\"ms\": [",
      ditops::backend_name(choice.backend), choice.detail.c_str(), ditops::cpu_info().isa.c_str());
  for (std::int64_t rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    ditops::attention_forward(shape(q.data()), shape(k.data()), shape(v.data()), shape(out.data()),
                              options);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s%.3f", rep == 0 ? "" : ", ", ms);
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (argc % 2 == 0) {
    std::fprintf(stderr, "ditops-attention-peer: flags come in pairs (--name value)\n");
    return 2;
  }
  try {
    const auto dtype = args.find("--dtype");
    if (dtype == args.end() || dtype->second == "f32") return run<float>(args);
    if (dtype->second == "bf16") return run<ditops::bf16>(args);
    throw std::invalid_argument("--dtype must be f32 or bf16");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ditops-attention-peer: %s\n", error.what());
    return 2;
  }
}
