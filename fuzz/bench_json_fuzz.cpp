// The Google Benchmark JSON reader behind bench-summary and ditops-sim --cpu (tools/bench_json)
// on any file contents: BenchJsonError, or entries whose every typed accessor answers or throws
// BenchJsonError (as the two tools use them), never another exception, a crash or a hang.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/bench_json.hpp"

namespace {

/// One file per process (libFuzzer runs inputs one after another in a process).
const std::string& scratch_file() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/ditops-bench-json-fuzz." +
           std::to_string(::getpid()) + ".json";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops::tools;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The token rewrite alone: never throws, and leaves a text without such tokens as it was.
  const std::string nulled = null_non_finite_numbers(text);
  if (text.find_first_of("nNiI") == std::string::npos && nulled != text) std::abort();
  {
    std::ofstream file(scratch_file(), std::ios::binary | std::ios::trunc);
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  std::ostringstream warnings;
  try {
    for (auto& entry : read_bench_json(scratch_file(), "fuzz: ", warnings)) {
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
