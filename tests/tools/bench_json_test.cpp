// tools/bench_json: non-finite numbers as Google Benchmark and printf write them are left out of
// their entry with one warning line each, strings are never touched, and anything else that is
// not Google Benchmark JSON is an error naming the file, entry and field.

#include "tools/bench_json.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace ditops::tools {
namespace {

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "bench_json_" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

int lines(const std::string& text) {
  int count = 0;
  for (const char c : text) count += c == '\n';
  return count;
}

/// The message of the BenchJsonError reading `text` throws, or "" where it reads.
std::string read_error(const std::string& name, const std::string& text) {
  std::ostringstream warnings;
  try {
    for (const BenchEntry& entry : read_bench_json(write_tmp(name, text), "test: ", warnings)) {
      entry.number("real_time", 0);
    }
  } catch (const BenchJsonError& error) {
    return error.what();
  }
  return "";
}

TEST(BenchJson, NonFiniteNumberTokensBecomeNull) {
  EXPECT_EQ(null_non_finite_numbers(
                R"([NaN, -NaN, nan, -nan, Infinity, -Infinity, inf, -inf, +INF, 1e5, -2.5])"),
            "[null, null, null, null, null, null, null, null, null, 1e5, -2.5]");
  EXPECT_EQ(null_non_finite_numbers(R"({"a":NaN,"b":null,"c":true,"d":false})"),
            R"({"a":null,"b":null,"c":true,"d":false})");
}

TEST(BenchJson, StringsAreNeverTouched) {
  const std::string text = R"({"label": "NaN inf -Infinity", "q": "say \"NaN\" \\", "x": nan})";
  EXPECT_EQ(null_non_finite_numbers(text),
            R"({"label": "NaN inf -Infinity", "q": "say \"NaN\" \\", "x": null})");
}

TEST(BenchJson, NonFiniteFieldsAreLeftOutWithOneWarningEach) {
  // As Google Benchmark writes the coefficient of variation of a counter that is 0 every run.
  const std::string path = write_tmp("nan.json", R"({
    "context": {"date": "today"},
    "benchmarks": [
      {"name": "BM_a/real_time_cv", "run_type": "aggregate", "real_time": 0.5,
       "frac_int8": NaN, "GOP/s": -Infinity, "label": "NaN stays"},
      {"name": "BM_b", "real_time": 2.0, "GB/s": inf, "frac_bw": -nan}
    ]})");
  std::ostringstream warnings;
  const std::vector<BenchEntry> entries = read_bench_json(path, "test: ", warnings);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].name(), "BM_a/real_time_cv");
  EXPECT_FALSE(entries[0].has("frac_int8"));
  EXPECT_FALSE(entries[0].has("GOP/s"));
  EXPECT_EQ(entries[0].text("label", ""), "NaN stays");
  EXPECT_DOUBLE_EQ(entries[0].number("real_time", 0), 0.5);
  EXPECT_FALSE(entries[1].has("GB/s"));
  EXPECT_FALSE(entries[1].has("frac_bw"));
  EXPECT_DOUBLE_EQ(entries[1].number("real_time", 0), 2.0);
  const std::string text = warnings.str();
  EXPECT_EQ(lines(text), 4) << text;
  EXPECT_NE(
      text.find("test: warning: '" + path + "': entry 'BM_a/real_time_cv': field 'frac_int8'"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("entry 'BM_b': field 'frac_bw'"), std::string::npos) << text;
}

TEST(BenchJson, MalformedFilesAreRejectedNamingTheFile) {
  const std::string truncated = read_error("truncated.json", R"({"benchmarks": [{"name": "a")");
  EXPECT_NE(truncated.find("truncated.json' is not Google Benchmark JSON"), std::string::npos)
      << truncated;
  // A number beyond double's range is an error of the file too, not a JSON library exception.
  const std::string overflow =
      read_error("overflow.json", R"({"benchmarks": [{"name": "a", "real_time": 1e400}]})");
  EXPECT_NE(overflow.find("overflow.json' is not Google Benchmark JSON"), std::string::npos)
      << overflow;
  EXPECT_NE(read_error("array.json", "[1, 2]").find("not an object"), std::string::npos);
  EXPECT_NE(read_error("list.json", R"({"benchmarks": 3})").find("'benchmarks' is not an array"),
            std::string::npos);
  std::ostringstream warnings;
  EXPECT_THROW(read_bench_json(::testing::TempDir() + "/no/such/file.json", "test: ", warnings),
               BenchJsonError);
  EXPECT_EQ(read_error("empty.json", "{}"), "");  // no "benchmarks": no entries, no error
}

TEST(BenchJson, ErrorsNameTheEntryAndTheField) {
  EXPECT_NE(read_error("entry.json", R"({"benchmarks": [{"name": "ok"}, 7]})").find("entry #1 is"),
            std::string::npos);
  EXPECT_NE(read_error("name.json", R"({"benchmarks": [{"name": 3}]})")
                .find("entry '#0': field 'name' is not a string"),
            std::string::npos);
  EXPECT_NE(read_error("type.json", R"({"benchmarks": [{"name": "BM_x", "real_time": "fast"}]})")
                .find("entry 'BM_x': field 'real_time' is not a number"),
            std::string::npos);
}

}  // namespace
}  // namespace ditops::tools
