// bench-summary: turns Google Benchmark JSON (--benchmark_format=json) into the markdown tables
// of out/summary.md and bench/RESULTS.md: each kernel's rate, its fraction of the measured
// limit, and its ratio to the baseline run in the same process (the entry whose name differs
// only in "eigen:1" / "backend:reference" style arguments). Read through tools/bench_json.hpp:
// NaN or infinite fields are left out with a warning. An entry with no rate counter (a limit
// this CPU lacks) shows "-" as its rate; its label says why.
//
// Usage: bench-summary RESULTS.json [more.json...]

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tools/bench_json.hpp"

namespace {

using ditops::tools::BenchEntry;

std::string format(double value, const char* spec) {
  char text[64];
  std::snprintf(text, sizeof text, spec, value);
  return text;
}

/// The rate counter an entry reports, in display order of preference; "" where it has none (a
/// limit the CPU lacks: its label says so).
std::pair<std::string, double> rate_of(const BenchEntry& entry) {
  for (const char* unit : {"GFLOP/s", "GB/s", "GOP/s", "Minstr/s"}) {
    if (entry.has(unit)) return {unit, entry.number(unit, 0)};
  }
  return {"", 0};
}

double fraction_of(const BenchEntry& entry) {
  for (const char* key : {"frac_bw", "frac_peak", "frac_int8"}) {
    if (entry.has(key)) return entry.number(key, 0);
  }
  return -1;
}
/// Name of the baseline entry for `name`, or "" when it is itself a baseline or has none:
/// "eigen:0" pairs with "eigen:1" (Eigen or reference backends), "flash:0" with "flash:1" at
/// "chunk:0" (the int8 attention backend against flash fp32, which has no chunk), and
/// "dense:0" with "dense:1" at "case:0" (sparse attention against dense flash).
std::string baseline_name(const std::string& name) {
  std::string base = name;
  for (const auto& [ours, theirs] : {std::pair<std::string, std::string>{"eigen:0", "eigen:1"},
                                     {"flash:0", "flash:1"},
                                     {"dense:0", "dense:1"}}) {
    const auto at = base.find(ours);
    if (at == std::string::npos) continue;
    base.replace(at, ours.size(), theirs);
    for (const std::string variant : {"chunk:", "case:"}) {
      const auto start = base.find(variant);
      if (start == std::string::npos) continue;
      const auto first = start + variant.size();
      const auto digits = base.find_first_not_of("0123456789", first);
      base.replace(first, (digits == std::string::npos ? base.size() : digits) - first, "0");
    }
    return base;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench-summary RESULTS.json [more.json...]\n");
    return 2;
  }
  try {
    std::vector<BenchEntry> entries;
    std::map<std::string, double> seconds_by_name;
    for (int i = 1; i < argc; ++i) {
      for (BenchEntry& entry :
           ditops::tools::read_bench_json(argv[i], "bench-summary: ", std::cerr)) {
        if (entry.flag("error_occurred", false)) continue;
        seconds_by_name[entry.name()] = entry.number("real_time", 0);
        entries.push_back(std::move(entry));
      }
    }
    std::printf("| benchmark | what | rate | fraction of limit | vs baseline |\n");
    std::printf("|---|---|---:|---:|---:|\n");
    for (const BenchEntry& entry : entries) {
      const std::string& name = entry.name();
      if (name.find("eigen:1") != std::string::npos) continue;  // shown as the ratio column
      const auto [unit, rate] = rate_of(entry);
      const double fraction = fraction_of(entry);
      std::string ratio = "";
      const std::string baseline = baseline_name(name);
      if (!baseline.empty() && seconds_by_name[baseline] > 0 && seconds_by_name[name] > 0) {
        ratio = format(seconds_by_name[baseline] / seconds_by_name[name], "%.2fx");
      }
      std::printf("| %s | %s | %s | %s | %s |\n", name.c_str(), entry.text("label", "").c_str(),
                  unit.empty() ? "-" : (format(rate, "%.1f") + " " + unit).c_str(),
                  fraction >= 0 ? format(100 * fraction, "%.0f%%").c_str() : "", ratio.c_str());
    }
  } catch (const ditops::tools::BenchJsonError& error) {
    std::fprintf(stderr, "bench-summary: %s\n", error.what());
    return 2;
  }
  return 0;
}
