// The attention tuning cache file (DITOPS_TUNE_CACHE) on any contents, through the public path a
// user takes: the file is read when the variable names a new path, its entries (any key, any
// configuration text) are merged, and a call whose key it names runs the cached configuration.
// Whatever the file says, select_attention answers with a valid backend and attention_forward
// matches the fp64 reference; a foreign file is left byte-identical.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <ditops/attention.hpp>
#include <fstream>
#include <iterator>
#include <string>

#include "fuzz/support.hpp"
#include "tests/reference/attention_ref.hpp"

namespace ditops::fuzz {
namespace {

/// Two cache paths used in turn (the cache reads a file again when the variable changes), on a
/// RAM file system where there is one: a miss stores its tuning result with an fsync.
std::string cache_path(int which) {
  static const std::string base = scratch_path("ditops-tune-fuzz");
  return base + (which ? ".b.json" : ".a.json");
}

std::string read_all(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  static int turn = 0;
  turn ^= 1;
  const std::string path = fuzz::cache_path(turn);
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  ::setenv("DITOPS_TUNE_CACHE", path.c_str(), 1);
  set_num_threads(1);
  // q, k, v [1, 16, 1, 8] f32: key "b1 sq16 sk16 n1/1 d8/8 f32 bsnd mask:none t1" (the seeds
  // name it, so mutations reach the configuration text).
  fuzz::TestTensor<float> q({1, 16, 1, 8}), k({1, 16, 1, 8}), v({1, 16, 1, 8}), out({1, 16, 1, 8});
  std::mt19937 rng(static_cast<std::uint32_t>(size));
  fuzz::fill(q, rng);
  fuzz::fill(k, rng);
  fuzz::fill(v, rng);
  const AttentionChoice choice = select_attention(q.view(), k.view(), v.view());
  if (std::string(backend_name(choice.backend)) == "unknown") {
    fuzz::failure("select_attention chose a backend outside the enum from the cache file");
  }
  attention_forward(q.view(), k.view(), v.view(), out.view());
  fuzz::expect_canaries(out, "attention_forward out");
  test::AttentionRefProblem p;
  p.q_len = p.kv_len = 16;
  p.dk = p.dv = 8;
  p.scale = 1 / std::sqrt(8.0);
  p.q = [&](auto, auto s, auto, auto d) { return q.value(s * 8 + d); };
  p.k = [&](auto, auto s, auto, auto d) { return k.value(s * 8 + d); };
  p.v = [&](auto, auto s, auto, auto d) { return v.value(s * 8 + d); };
  fuzz::check_close(out, test::attention_reference(p).out,
                    choice.backend == AttentionBackend::flash_bf16 ? test::Tolerance{3e-2, 1.5e-2}
                                                                   : test::kFlashF32,
                    std::string("attention_forward with cached ") + choice.detail);
  // A file that is not a ditops cache is never replaced.
  const std::string after = fuzz::read_all(path);
  if (after != text && text.find("ditops-attention-tune-v1") == std::string::npos) {
    fuzz::failure("a file without the cache format was rewritten");
  }
  return 0;
}
