// Backend choice: tuning and its cache (LRU, DITOPS_TUNE_CACHE persistence, corrupt files,
// files that are not a cache, bad entries, concurrent processes, unwritable files),
// DITOPS_ATTN_BACKEND forcing and fallback, and concurrent calls sharing the cache (the test
// the tsan preset runs).

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "tests/support/scoped_env.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

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
  // Forgotten choices are tuned again, and attention_forward says whether a choice was cached.
  forget_attention_tuning();
  AttentionChoice ran{};
  causal.ran = &ran;
  attention_forward(t.q.view(), t.k.view(), t.v.view(), t.out.view(), causal);
  EXPECT_FALSE(ran.from_cache) << ran.detail;
  attention_forward(t.q.view(), t.k.view(), t.v.view(), t.out.view(), causal);
  EXPECT_TRUE(ran.from_cache) << ran.detail;
  EXPECT_EQ(ran.backend, select_attention(t.q.view(), t.k.view(), t.v.view(), causal).backend);
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
    EXPECT_NE(warnings.find("DITOPS_ATTN_BACKEND=sparse: it needs a boolean attn_mask"),
              std::string::npos)
        << warnings;
    EXPECT_EQ(warnings.find("DITOPS_ATTN_BACKEND"), warnings.rfind("DITOPS_ATTN_BACKEND"))
        << "warned twice: " << warnings;
    // select_attention says why the forced backend did not serve the call.
    EXPECT_NE(choice.detail.find("(DITOPS_ATTN_BACKEND=sparse: it needs a boolean attn_mask)"),
              std::string::npos)
        << choice.detail;
    EXPECT_EQ(choice.detail.find("forced"), std::string::npos) << choice.detail;
  }
  {
    AttentionOptions options;
    options.backend = AttentionBackend::sparse;  // options win over the environment
    ScopedEnv env("DITOPS_ATTN_BACKEND", "reference");
    testing::internal::CaptureStderr();
    const AttentionChoice choice = select_attention(t.q.view(), t.k.view(), t.v.view(), options);
    testing::internal::GetCapturedStderr();
    EXPECT_NE(choice.backend, AttentionBackend::sparse);
    EXPECT_NE(choice.detail.find("(options.backend=sparse: it needs a boolean attn_mask)"),
              std::string::npos)
        << choice.detail;
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
  for (const auto& file : {path, seeded, corrupt}) {
    std::filesystem::remove(file);
    std::filesystem::remove(file + ".lock");
  }
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string key_of(std::int64_t sq, std::int64_t sk) {
  return "b1 sq" + std::to_string(sq) + " sk" + std::to_string(sk) +
         " n4/2 d64/64 f32 bsnd mask:none t1";
}

/// Opens `fifo` for writing (and closes it) once `after` has passed, which releases a reader
/// blocked on it: a regression then fails on time instead of hanging the suite.
class FifoRescuer {
 public:
  FifoRescuer(std::string fifo, std::chrono::seconds after)
      : thread_([this, fifo = std::move(fifo), after] {
          const auto deadline = std::chrono::steady_clock::now() + after;
          while (!stop_) {
            if (std::chrono::steady_clock::now() > deadline) {
              const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
              if (fd >= 0) ::close(fd);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~FifoRescuer() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// DITOPS_TUNE_CACHE naming a FIFO (as /dev/null names a device), a symbolic link, a foreign JSON
// file or a corrupt one: never blocked on, never replaced or written through; one warning.
TEST(AttentionTuner, NonRegularAndForeignCacheFilesAreLeftAlone) {
  set_num_threads(1);
  std::mt19937 rng(56);
  const TempDir dir;
  const std::string fifo = dir / "fifo.json", target = dir / "target.json",
                    link = dir / "link.json", foreign = dir / "garbage.json",
                    corrupt = dir / "corrupt.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string valid_cache = R"({"format": "ditops-attention-tune-v1", "entries": []})"
                                  "\n";
  write_text(target, valid_cache);  // even a real cache is not written through a link
  std::filesystem::create_symlink(target, link);
  write_text(foreign, R"({"format": "someone-else", "entries": []})");
  write_text(corrupt, "{ this is not json");
  const auto before = dir.names();
  const FifoRescuer rescuer(fifo, std::chrono::seconds(10));
  std::int64_t sq = 101;
  for (const std::string& path : {fifo, link, foreign, corrupt}) {
    ScopedEnv env("DITOPS_TUNE_CACHE", path);
    testing::internal::CaptureStderr();
    const auto start = std::chrono::steady_clock::now();
    Tensors t(sq++, 33, rng);
    EXPECT_FALSE(select_attention(t.q.view(), t.k.view(), t.v.view()).from_cache);
    EXPECT_TRUE(select_attention(t.q.view(), t.k.view(), t.v.view()).from_cache);
    Tensors other(sq++, 33, rng);
    select_attention(other.q.view(), other.k.view(), other.v.view());
    const std::string warnings = testing::internal::GetCapturedStderr();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
        << path << " blocked the call";
    const std::string warning = "ignoring tuning cache " + path + " (";
    EXPECT_NE(warnings.find(warning), std::string::npos) << warnings;
    EXPECT_EQ(warnings.find(warning), warnings.rfind(warning)) << "warned twice: " << warnings;
  }
  struct stat info;
  ASSERT_EQ(::lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode)) << "the FIFO was replaced";
  ASSERT_EQ(::lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode)) << "the link was replaced";
  EXPECT_EQ(file_text(target), valid_cache);
  EXPECT_EQ(file_text(foreign), R"({"format": "someone-else", "entries": []})");
  EXPECT_EQ(file_text(corrupt), "{ this is not json");
  EXPECT_EQ(dir.names(), before) << "files were created beside the refused ones";
}

// A hand-edited cache: each bad entry is dropped with a warning naming it, the others used.
TEST(AttentionTuner, BadCacheEntriesAreDroppedOneByOne) {
  set_num_threads(1);
  std::mt19937 rng(57);
  const TempDir dir;
  const std::string path = dir / "cache.json";
  const auto entry = [](std::int64_t sq, const std::string& config, const std::string& extra) {
    return R"({"key": ")" + key_of(sq, 33) + R"(", "config": ")" + config + "\"" + extra + "}";
  };
  write_text(path, R"({"format": "ditops-attention-tune-v1", "entries": [)" +
                       entry(111, "flash k=direct row_group=1", "") + ", " +
                       entry(112, "flash_bf16 k=packed row_group=16", "") + ", " +
                       entry(113, "flash k=packed row_group=16abc", "") + ", " +
                       entry(114, "flash k=direct row_group=1", R"(, "note": "mine")") + ", " +
                       entry(115, "flash k=packed row_group=4", "") + ", 7]}");
  ScopedEnv env("DITOPS_TUNE_CACHE", path);
  testing::internal::CaptureStderr();
  std::map<std::int64_t, AttentionChoice> choices;
  for (std::int64_t sq = 111; sq <= 115; ++sq) {
    Tensors t(sq, 33, rng);
    choices.emplace(sq, select_attention(t.q.view(), t.k.view(), t.v.view()));
  }
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(choices.at(111).from_cache);
  EXPECT_NE(choices.at(111).detail.find("flash k=direct row_group=1"), std::string::npos)
      << choices.at(111).detail;
  EXPECT_TRUE(choices.at(115).from_cache);
  EXPECT_NE(choices.at(115).detail.find("flash k=packed row_group=4"), std::string::npos)
      << choices.at(115).detail;
  for (std::int64_t sq : {112, 113, 114}) {
    EXPECT_FALSE(choices.at(sq).from_cache) << sq << ": " << choices.at(sq).detail;
  }
  for (const char* dropped :
       {"entry #1 dropped (backend flash_bf16 is not allowed for f32",
        "entry #2 dropped (config \"flash k=packed row_group=16abc\"",
        "entry #3 dropped (unknown field \"note\")", "entry #5 dropped (not an object)"}) {
    EXPECT_NE(warnings.find(dropped), std::string::npos) << dropped << " in: " << warnings;
  }
  // Rewritten with the good entries and the new tuning results, without the bad ones.
  const std::string text = file_text(path);
  EXPECT_NE(text.find(key_of(111, 33)), std::string::npos) << text;
  EXPECT_NE(text.find("flash k=direct row_group=1"), std::string::npos) << text;
  EXPECT_EQ(text.find("16abc"), std::string::npos) << text;
  EXPECT_EQ(text.find("note"), std::string::npos) << text;
}

// Processes that tune at once, each storing its own entry, keep each other's (merge-on-write
// under a lock file). Each child uses one thread: no OpenMP team crosses the fork.
TEST(AttentionTuner, ConcurrentProcessesKeepEachOthersEntries) {
  set_num_threads(1);
  const TempDir dir;
  const std::string path = dir / "cache.json";
  ScopedEnv env("DITOPS_TUNE_CACHE", path);
  constexpr int kProcesses = 12;
  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(start[1]);
      char go;
      while (::read(start[0], &go, 1) < 0 && errno == EINTR) {
      }
      int status = 0;
      try {
        std::mt19937 rng(100 + i);
        Tensors t(121 + i, 33, rng);
        status = select_attention(t.q.view(), t.k.view(), t.v.view()).from_cache ? 2 : 0;
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // every child starts now
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  const std::string text = file_text(path);
  for (int i = 0; i < kProcesses; ++i) {
    EXPECT_NE(text.find(key_of(121 + i, 33)), std::string::npos) << "lost entry " << i;
  }
  for (const std::string& name : dir.names()) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "left behind: " << name;
  }
}

struct ChildRun {
  int status = -1;
  std::string stderr_text;
};

/// Runs `body` in a child process, its stderr through a pipe (a file size limit set in the
/// child would truncate a log file too).
template <class Body>
ChildRun in_child(const Body& body) {
  ChildRun run;
  int err[2];
  if (::pipe(err) != 0) return run;
  const pid_t pid = ::fork();
  if (pid < 0) return run;
  if (pid == 0) {
    ::close(err[0]);
    if (::dup2(err[1], STDERR_FILENO) < 0) ::_exit(3);
    int status = 0;
    try {
      status = body();
    } catch (...) {
      status = 1;
    }
    ::_exit(status);
  }
  ::close(err[1]);
  char buffer[4096];
  for (ssize_t got; (got = ::read(err[0], buffer, sizeof buffer)) != 0;) {
    if (got > 0) run.stderr_text.append(buffer, static_cast<std::size_t>(got));
    if (got < 0 && errno != EINTR) break;
  }
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// A full disk (a file size limit) and a read-only directory: a warning, once, and the calls go
// on; the old cache file stays whole and no temporary file is left.
TEST(AttentionTuner, UnwritableCacheWarnsOnceAndKeepsTheOldFile) {
  set_num_threads(1);
  const TempDir dir;
  const auto tune_two_shapes = [](std::int64_t first_sq) {
    std::mt19937 rng(58);
    for (std::int64_t sq = first_sq; sq < first_sq + 2; ++sq) {
      Tensors t(sq, 33, rng);
      if (select_attention(t.q.view(), t.k.view(), t.v.view()).from_cache) return 2;
    }
    return 0;
  };
  const auto count = [](const std::string& text, const std::string& what) {
    int found = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
      ++found;
    }
    return found;
  };

  const std::string full = dir / "full.json";
  const std::string old_cache = R"({"format": "ditops-attention-tune-v1", "entries": [)"
                                R"({"key": ")" +
                                key_of(131, 33) + R"(", "config": "flash k=direct row_group=1"}]})";
  write_text(full, old_cache);
  const ChildRun full_run = in_child([&] {
    ::setenv("DITOPS_TUNE_CACHE", full.c_str(), 1);
    std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing
    const rlimit limit{64, 64};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 4;
    return tune_two_shapes(132);
  });
  EXPECT_EQ(full_run.status, 0);
  EXPECT_EQ(count(full_run.stderr_text, "cannot write tuning cache " + full), 1)
      << full_run.stderr_text;
  EXPECT_EQ(file_text(full), old_cache);

  const std::string readonly = dir / "readonly";
  ASSERT_EQ(::mkdir(readonly.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const ChildRun readonly_run = in_child([&] {
    // root writes anywhere: drop to an unprivileged user first.
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 5;
    ::setenv("DITOPS_TUNE_CACHE", (readonly + "/cache.json").c_str(), 1);
    return tune_two_shapes(134);
  });
  if (readonly_run.status == 5) {
    GTEST_SKIP() << "cannot drop root privileges for the read-only directory case";
  }
  EXPECT_EQ(readonly_run.status, 0);
  EXPECT_EQ(
      count(readonly_run.stderr_text, "cannot write tuning cache " + readonly + "/cache.json"), 1)
      << readonly_run.stderr_text;
  EXPECT_TRUE(dir.names("readonly").empty());
  for (const std::string& name : dir.names()) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "left behind: " << name;
  }
}

// A process killed (SIGKILL) at any moment while it tunes and rewrites the cache: the file is
// then absent or a whole ditops cache, never a truncated one (temporary file, fsync, rename).
// The kills land at spread delays in a child that does nothing but tune and save, so several of
// them hit a write in progress.
TEST(AttentionTuner, KilledWriterLeavesTheCacheWholeOrAbsent) {
  set_num_threads(1);
  const TempDir dir;
  const std::string path = dir / "cache.json";
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("DITOPS_TUNE_CACHE", path.c_str(), 1);
      std::mt19937 rng(700 + round);
      for (std::int64_t sq = 1;; ++sq) {  // every shape a miss: tune, then save the file
        Tensors t(1 + (sq * 7 + round * 131) % 400, 9, rng);
        select_attention(t.q.view(), t.k.view(), t.v.view());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 17 * round));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));
    if (!std::filesystem::exists(path)) continue;
    const std::string text = file_text(path);
    EXPECT_NE(text.find(R"("format": "ditops-attention-tune-v1")"), std::string::npos)
        << "round " << round << ": " << text;
    EXPECT_EQ(text.back() == '\n' ? text[text.size() - 2] : text.back(), '}')
        << "round " << round << ": truncated: " << text;
    // And the library reads it back as its own: no "not a ditops tuning cache" warning.
    const ChildRun reader = in_child([&] {
      ::setenv("DITOPS_TUNE_CACHE", path.c_str(), 1);
      std::mt19937 rng(1);
      Tensors t(5, 9, rng);
      select_attention(t.q.view(), t.k.view(), t.v.view());
      return 0;
    });
    EXPECT_EQ(reader.status, 0);
    EXPECT_EQ(reader.stderr_text.find("left as it is"), std::string::npos) << reader.stderr_text;
    EXPECT_EQ(reader.stderr_text.find("not JSON"), std::string::npos) << reader.stderr_text;
  }
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
