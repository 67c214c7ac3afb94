// The Google Benchmark JSON reader behind bench-summary and ditops-sim --cpu (tools/bench_json)
// on any file contents: BenchJsonError, or entries whose every typed accessor answers or throws
// BenchJsonError (as the two tools use them), never another exception, a crash or a hang.

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "tools/bench_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops::tools;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The token rewrite alone: never throws, and leaves a text without such tokens as it was.
  const std::string nulled = null_non_finite_numbers(text);
  if (text.find_first_of("nNiI") == std::string::npos && nulled != text) std::abort();
  // The text as read_bench_json parses a file's contents (no file: its reading is the unit
  // tests' subject, and writing one per input was a third of the time).
  std::ostringstream warnings;
  try {
    for (auto& entry : parse_bench_json(text, "fuzz.json", "fuzz: ", warnings)) {
      for (const char* field : {"name", "run_name", "run_type", "time_unit", "real_time",
                                "cpu_time", "iterations", "error_occurred", "aggregate_name"}) {
        try {
          entry.has(field);
          entry.number(field, 0);
        } catch (const BenchJsonError&) {
        }
        try {
          entry.text(field, "");
        } catch (const BenchJsonError&) {
        }
        try {
          entry.flag(field, false);
        } catch (const BenchJsonError&) {
        }
      }
      entry.drop_nulls("fuzz: ", warnings);
    }
  } catch (const BenchJsonError&) {
  }
  return 0;
}
