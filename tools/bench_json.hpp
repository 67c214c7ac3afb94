#pragma once
// Google Benchmark JSON (--benchmark_out_format=json), read tolerantly: shared by bench-summary
// and `ditops-sim sweep --cpu`. Google Benchmark writes a non-finite double as NaN, -NaN,
// Infinity or -Infinity (a counter of 0 over repetitions has a coefficient of variation of
// 0/0), and printf-style writers as nan, -nan, inf or -inf; JSON has no word for any of them,
// so a strict parser rejects the whole file for one such field. Here they are read as null and
// dropped from their entry, with one warning line per field; anything else that is not Google
// Benchmark JSON is an error naming the file, and where it is in one entry, the entry and field.

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace ditops::tools {

/// Not Google Benchmark JSON; the message names the file (and the entry and field).
class BenchJsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `text` with every non-finite number token outside strings (optional sign, then nan, inf or
/// infinity in any case) replaced by null.
std::string null_non_finite_numbers(const std::string& text);

/// One entry of the "benchmarks" array, with typed access that names the entry and field in
/// its errors.
class BenchEntry {
 public:
  /// Entry `index` of `file`; throws BenchJsonError where its "name" is not a string.
  BenchEntry(std::string file, std::size_t index, nlohmann::json fields);

  /// "name", or "#N" (its index) where the entry has none.
  const std::string& name() const { return name_; }
  bool has(const char* field) const { return fields_.contains(field); }
  /// The field, or `fallback` where the entry lacks it; BenchJsonError where it has another type.
  double number(const char* field, double fallback) const;
  std::string text(const char* field, const std::string& fallback) const;
  bool flag(const char* field, bool fallback) const;
  /// Throws BenchJsonError "'FILE': entry 'NAME': field 'FIELD' " + problem.
  [[noreturn]] void fail(const char* field, const std::string& problem) const;
  /// Drops the null fields (the non-finite numbers null_non_finite_numbers replaced), with one
  /// warning line each on `warnings`, starting with `tool`.
  void drop_nulls(const std::string& tool, std::ostream& warnings);

 private:
  std::string file_, name_;
  nlohmann::json fields_;
};

/// The entries of the Google Benchmark JSON file at `path` (none where it has no "benchmarks"),
/// non-finite fields dropped with one line each on `warnings`, starting with `tool` (the
/// caller's name, "bench-summary: "). Throws BenchJsonError where the file cannot be read, is not
/// JSON, or is not an object with an array of object entries each named by a string.
std::vector<BenchEntry> read_bench_json(const std::string& path, const std::string& tool,
                                        std::ostream& warnings);

/// read_bench_json on a file's contents already in memory (`path` only names the file in
/// messages). Throws BenchJsonError where `text` is not JSON or not such an object.
std::vector<BenchEntry> parse_bench_json(const std::string& text, const std::string& path,
                                         const std::string& tool, std::ostream& warnings);

}  // namespace ditops::tools
