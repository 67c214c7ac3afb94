// bench-summary: turns Google Benchmark JSON (--benchmark_format=json) into the markdown tables
// of out/summary.md and bench/RESULTS.md: each kernel's rate, its fraction of the measured
// limit, and its ratio to the baseline run in the same process (the entry whose name differs
// only in "eigen:1" / "backend:reference" style arguments). Read through tools/bench_json.hpp:
// NaN or infinite fields are left out with a warning. An entry with no rate counter (a limit
// this CPU lacks) shows "-" as its rate; its label says why.
//
// Usage: bench-summary [--filter REGEX] [--baseline ARG:VALUE] [--time] RESULTS.json [more.json...]
//   --filter REGEX      only the entries whose name REGEX matches (ECMAScript, anywhere in the
//                       name); baselines are still looked up among all entries
//   --baseline ARG:VAL  each entry's baseline is the entry whose argument ARG is VAL instead
//                       ("kind:3": Eigen in ditops_linear_bench), in place of the built-in pairs
//   --time              a time column: real time per iteration, in the entry's unit
// Repetitions (--benchmark_repetitions): where a run has a median aggregate, its row is that
// median, its single repetitions and other aggregates (mean, stddev, cv) left out. Names are
// shown without Google Benchmark's "/real_time" and "_median" suffixes.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>
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

/// `name` with argument `arg` ("kind:") given `value` instead; "" where `name` has no such
/// argument or already has that value.
std::string with_argument(const std::string& name, const std::string& arg,
                          const std::string& value) {
  const auto start = name.find("/" + arg);
  if (start == std::string::npos) return "";
  const auto first = start + 1 + arg.size();
  const auto end = name.find_first_not_of("0123456789", first);
  const auto length = (end == std::string::npos ? name.size() : end) - first;
  if (name.compare(first, length, value) == 0) return "";
  return name.substr(0, first) + value + name.substr(first + length);
}

/// `name` without "_median" and "/real_time" at its end.
std::string display_name(std::string name) {
  for (const std::string suffix : {"_median", "/real_time"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix))
      name.resize(name.size() - suffix.size());
  }
  return name;
}

/// Real time per iteration with 3 significant digits or more, and its unit.
std::string time_of(const BenchEntry& entry) {
  const double t = entry.number("real_time", 0);
  const char* spec = t >= 100 ? "%.0f " : t >= 10 ? "%.1f " : t >= 1 ? "%.2f " : "%.3g ";
  return format(t, spec) + entry.text("time_unit", "ns");
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench-summary [--filter REGEX] [--baseline ARG:VALUE] [--time] "
               "RESULTS.json [more.json...]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::regex> filter;
  std::string baseline_arg, baseline_value;
  bool show_time = false;
  int i = 1;
  for (; i < argc && std::string(argv[i]).starts_with("--"); ++i) {
    const std::string option = argv[i];
    if (option == "--time") {
      show_time = true;
    } else if ((option == "--filter" || option == "--baseline") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (option == "--filter") {
        try {
          filter.emplace(value);
        } catch (const std::regex_error& error) {
          std::fprintf(stderr, "bench-summary: --filter '%s': %s\n", value.c_str(), error.what());
          return 2;
        }
      } else {
        const auto colon = value.find(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == value.size()) usage();
        baseline_arg = value.substr(0, colon + 1);
        baseline_value = value.substr(colon + 1);
      }
    } else {
      usage();
    }
  }
  if (i >= argc) usage();
  try {
    std::vector<BenchEntry> entries;
    std::map<std::string, double> seconds_by_name;
    std::set<std::string> runs_with_median;
    for (; i < argc; ++i) {
      std::vector<BenchEntry> file_entries =
          ditops::tools::read_bench_json(argv[i], "bench-summary: ", std::cerr);
      // Rows in the order the benchmarks are declared: a run with random interleaving writes
      // its repetitions and aggregates in the order they ran.
      std::stable_sort(
          file_entries.begin(), file_entries.end(), [](const BenchEntry& a, const BenchEntry& b) {
            return std::pair(a.number("family_index", 0),
                             a.number("per_family_instance_index", 0)) <
                   std::pair(b.number("family_index", 0), b.number("per_family_instance_index", 0));
          });
      for (BenchEntry& entry : file_entries) {
        if (entry.flag("error_occurred", false)) continue;
        seconds_by_name[entry.name()] = entry.number("real_time", 0);
        if (entry.text("aggregate_name", "") == "median") {
          runs_with_median.insert(entry.text("run_name", entry.name()));
        }
        entries.push_back(std::move(entry));
      }
    }
    std::printf("| benchmark | what |%s rate | fraction of limit | vs baseline |\n",
                show_time ? " time |" : "");
    std::printf("|---|---|%s---:|---:|---:|\n", show_time ? "---:|" : "");
    for (const BenchEntry& entry : entries) {
      const std::string& name = entry.name();
      if (entry.text("run_type", "iteration") == "aggregate") {
        if (entry.text("aggregate_name", "") != "median") continue;
      } else if (runs_with_median.contains(entry.text("run_name", name))) {
        continue;  // one repetition of a run shown by its median
      }
      if (filter && !std::regex_search(name, *filter)) continue;
      if (baseline_arg.empty() && name.find("eigen:1") != std::string::npos) {
        continue;  // shown as the ratio column
      }
      const auto [unit, rate] = rate_of(entry);
      const double fraction = fraction_of(entry);
      std::string ratio = "";
      const std::string baseline = baseline_arg.empty()
                                       ? baseline_name(name)
                                       : with_argument(name, baseline_arg, baseline_value);
      if (!baseline.empty() && seconds_by_name[baseline] > 0 && seconds_by_name[name] > 0) {
        ratio = format(seconds_by_name[baseline] / seconds_by_name[name], "%.2fx");
      }
      std::printf("| %s | %s |%s %s | %s | %s |\n", display_name(name).c_str(),
                  entry.text("label", "").c_str(),
                  show_time ? (" " + time_of(entry) + " |").c_str() : "",
                  unit.empty() ? "-" : (format(rate, "%.1f") + " " + unit).c_str(),
                  fraction >= 0 ? format(100 * fraction, "%.0f%%").c_str() : "", ratio.c_str());
    }
  } catch (const ditops::tools::BenchJsonError& error) {
    std::fprintf(stderr, "bench-summary: %s\n", error.what());
    return 2;
  }
  return 0;
}
