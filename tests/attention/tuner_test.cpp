// Backend choice: tuning and its cache (LRU, DITOPS_TUNE_CACHE persistence, corrupt files),
// DITOPS_ATTN_BACKEND forcing and fallback, and concurrent calls sharing the cache (the test
// the tsan preset runs).

#include <cstdlib>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

/// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct Tensors {
  TestTensor<float> q, k, v, out;
  Tensors(std::int64_t sq, std::int64_t sk, std::mt19937& rng)
      : q({1, sq, 4, 64}), k({1, sk, 2, 64}), v({1, sk, 2, 64}), out({1, sq, 4, 64}) {
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
};

std::string unique_path(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          (stem + "." + std::to_string(::getpid()) + "." + active_isa_name() + ".json"))
      .string();
}

TEST(AttentionTuner, SecondSelectionComesFromTheCache) {
  set_num_threads(1);
  std::mt19937 rng(51);
  Tensors t(37, 91, rng);  // a shape no other test uses
  const AttentionChoice first = select_attention(t.q.view(), t.k.view(), t.v.view());
  EXPECT_FALSE(first.from_cache);
  // fp32 inputs: never the less exact flash_bf16.
  EXPECT_EQ(first.backend, AttentionBackend::flash) << first.detail;
  const AttentionChoice second = select_attention(t.q.view(), t.k.view(), t.v.view());
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.detail, first.detail);
  // attention_forward reuses the choice and select_attention wrote nothing to the user's out.
  const auto before = t.out.snapshot();
  EXPECT_TRUE(t.out.unchanged_since(before));
  AttentionOptions causal;
  causal.causal = true;  // another key
  EXPECT_FALSE(select_attention(t.q.view(), t.k.view(), t.v.view(), causal).from_cache);
}

TEST(AttentionTuner, EnvironmentForcesABackendOrFallsBackWithOneWarning) {
  set_num_threads(1);
  std::mt19937 rng(52);
  Tensors t(5, 40, rng);
  {
    ScopedEnv env("DITOPS_ATTN_BACKEND", "reference");
    const AttentionChoice choice = select_attention(t.q.view(), t.k.view(), t.v.view());
    EXPECT_EQ(choice.backend, AttentionBackend::reference);
    EXPECT_NE(choice.detail.find("forced"), std::string::npos) << choice.detail;
  }
  {
    ScopedEnv env("DITOPS_ATTN_BACKEND", "sparse");
    testing::internal::CaptureStderr();
    const AttentionChoice choice = select_attention(t.q.view(), t.k.view(), t.v.view());
    select_attention(t.q.view(), t.k.view(), t.v.view());
    const std::string warnings = testing::internal::GetCapturedStderr();
    EXPECT_NE(choice.backend, AttentionBackend::sparse);
    EXPECT_NE(warnings.find("DITOPS_ATTN_BACKEND=sparse"), std::string::npos) << warnings;
    EXPECT_EQ(warnings.find("sparse"), warnings.rfind("sparse")) << "warned twice: " << warnings;
  }
}

TEST(AttentionTuner, CachePersistsAsJsonAndIgnoresCorruptFiles) {
  set_num_threads(1);
  std::mt19937 rng(53);
  const std::string path = unique_path("ditops_tune");
  std::filesystem::remove(path);
  {
    ScopedEnv env("DITOPS_TUNE_CACHE", path);
    Tensors t(29, 77, rng);
    select_attention(t.q.view(), t.k.view(), t.v.view());
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find("b1 sq29 sk77 n4/2 d64/64 f32 bsnd mask:none t1"), std::string::npos)
        << text;
  }
  // A file written by someone else: its (valid) entry is used.
  const std::string seeded = unique_path("ditops_tune_seeded");
  {
    std::ofstream out(seeded);
    out << R"({"format": "ditops-attention-tune-v1", "entries": [)"
        << R"({"key": "b1 sq31 sk65 n4/2 d64/64 f32 bsnd mask:none t1",)"
        << R"( "config": "flash k=direct row_group=1"}]})";
  }
  {
    ScopedEnv env("DITOPS_TUNE_CACHE", seeded);
    Tensors t(31, 65, rng);
    const AttentionChoice choice = select_attention(t.q.view(), t.k.view(), t.v.view());
    EXPECT_TRUE(choice.from_cache);
    EXPECT_NE(choice.detail.find("k=direct"), std::string::npos) << choice.detail;
  }
  // Corrupt and foreign files: one warning, then tuning works as without a file.
  const std::string corrupt = unique_path("ditops_tune_corrupt");
  {
    std::ofstream out(corrupt);
    out << "{ this is not json";
  }
  {
    ScopedEnv env("DITOPS_TUNE_CACHE", corrupt);
    testing::internal::CaptureStderr();
    Tensors t(23, 45, rng);
    const AttentionChoice choice = select_attention(t.q.view(), t.k.view(), t.v.view());
    const std::string warnings = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(choice.from_cache);
    EXPECT_NE(warnings.find("ignoring tuning cache"), std::string::npos) << warnings;
  }
  for (const auto& file : {path, seeded, corrupt}) std::filesystem::remove(file);
}

// Several application threads call attention_forward (automatic: they tune and share the
// cache) at once; every result must match a forced flash run. Each call uses one ditops
// thread so the test's own std::threads are the only concurrency (libgomp is not
// instrumented by ThreadSanitizer).
TEST(AttentionConcurrency, ConcurrentCallsShareTheCacheCorrectly) {
  set_num_threads(1);
  std::mt19937 rng(54);
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<Tensors>> inputs;
  std::vector<std::vector<double>> expected;
  for (int i = 0; i < kThreads; ++i) {
    inputs.push_back(std::make_unique<Tensors>(i % 2 ? 3 : 41, 66 + 10 * (i % 2), rng));
    AttentionOptions flash;
    flash.backend = AttentionBackend::flash;
    Tensors& t = *inputs.back();
    attention_forward(t.q.view(), t.k.view(), t.v.view(), t.out.view(), flash);
    expected.emplace_back();
    for (std::int64_t e = 0; e < t.out.size(); ++e) expected.back().push_back(t.out.value(e));
  }
  std::vector<std::vector<std::vector<double>>> results(kThreads);
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back([&, i] {
      Tensors& mine = *inputs[i];
      TestTensor<float> out(mine.out.shape());
      for (int repeat = 0; repeat < 3; ++repeat) {
        attention_forward(mine.q.view(), mine.k.view(), mine.v.view(), out.view());
        std::vector<double> values;
        for (std::int64_t e = 0; e < out.size(); ++e) values.push_back(out.value(e));
        results[i].push_back(std::move(values));
      }
    });
  }
  for (auto& worker : workers) worker.join();
  for (int i = 0; i < kThreads; ++i) {
    for (const auto& values : results[i]) {
      ASSERT_EQ(values.size(), expected[i].size());
      for (std::size_t e = 0; e < values.size(); ++e) {
        // Tuned and forced runs may use other tiles: equal up to fp32 reassociation.
        ASSERT_NEAR(values[e], expected[i][e], 1e-5 + 1e-5 * std::fabs(expected[i][e]))
            << "thread " << i << " element " << e;
      }
    }
  }
}

}  // namespace
}  // namespace ditops::test
