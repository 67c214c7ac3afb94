// ditops-sim validate: every measurement set (sim/measurements/*.csv, published timings of
// attention kernels on Ascend 910B-class chips) predicted by the model, set by set: the ratios
// between configurations, their errors and whether each trend goes the measured way.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/calibrate.hpp"
#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"

namespace ditops::tools::sim_cli {
namespace {

// A step of a trend smaller than this (relative) is flat: published timings of one run move by a
// few per cent between neighbouring points for no reason the model could know.
constexpr double kFlatStep = 0.02;

/// One ratio: a row's time over its base's (the first row of its series, or the speedup's base).
struct RatioCheck {
  std::string series, label;
  double measured = 0, predicted = 0;
  double error() const { return predicted / measured - 1; }
};

struct SetResult {
  sim::MeasurementSet set;
  std::vector<RatioCheck> ratios;
  int trend_steps = 0, trends_right = 0;
  double median_error = 0, max_error = 0;  // of |predicted / measured - 1|
};

/// -1, 0 (flat) or +1: the direction of a step from `from` to `to`.
int direction(double from, double to) {
  if (std::abs(to / from - 1) < kFlatStep) return 0;
  return to > from ? 1 : -1;
}

SetResult check_set(sim::MeasurementSet set, const sim::HwParams& hw) {
  SetResult result;
  const std::vector<double> predicted = sim::predict_rows(set.rows, hw);
  // Time ratios (the inverse of a speedup), and each series' steps in file order from its base.
  std::map<std::string, std::pair<double, double>> last;  // series -> (measured, predicted)
  for (std::size_t i = 0; i < set.rows.size(); ++i) {
    const sim::Measurement& row = set.rows[i];
    if (!row.speedup) continue;  // a plain time is no ratio
    RatioCheck check{row.series, sim::measurement_label(row), 1 / row.value, 1 / predicted[i]};
    const auto [previous, first] = last.emplace(row.series, std::make_pair(1.0, 1.0));
    if (!row.series.empty()) {
      ++result.trend_steps;
      result.trends_right += direction(previous->second.first, check.measured) ==
                             direction(previous->second.second, check.predicted);
      previous->second = {check.measured, check.predicted};
    }
    result.ratios.push_back(check);
  }
  std::vector<double> errors;
  for (const RatioCheck& check : result.ratios) errors.push_back(std::abs(check.error()));
  std::sort(errors.begin(), errors.end());
  if (!errors.empty()) {
    const std::size_t n = errors.size();
    result.median_error = n % 2 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
    result.max_error = errors.back();
  }
  result.set = std::move(set);
  return result;
}

/// The *.csv files of `dir`, sorted by name.
std::vector<std::string> measurement_files(const std::string& dir) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    throw UsageError("--dir " + dir + " is not a directory");
  }
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".csv") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw UsageError("--dir " + dir + " holds no *.csv measurement set");
  return files;
}

void print_json(const std::vector<SetResult>& results) {
  nlohmann::ordered_json sets = nlohmann::ordered_json::array();
  for (const SetResult& result : results) {
    nlohmann::ordered_json ratios = nlohmann::ordered_json::array();
    for (const RatioCheck& check : result.ratios) {
      ratios.push_back({{"series", check.series},
                        {"config", check.label},
                        {"measured_ratio", check.measured},
                        {"predicted_ratio", check.predicted},
                        {"error", check.error()}});
    }
    sets.push_back({{"name", result.set.name},
                    {"role", result.set.role},
                    {"ratios", ratios},
                    {"median_abs_error", result.median_error},
                    {"max_abs_error", result.max_error},
                    {"trend_steps", result.trend_steps},
                    {"trends_right", result.trends_right}});
  }
  std::cout << nlohmann::ordered_json{{"sets", sets}}.dump(2) << '\n';
}

void print_tables(const std::vector<SetResult>& results, const std::string& dir) {
  std::printf("ditops-sim validate: %zu measurement sets from %s\n", results.size(), dir.c_str());
  std::printf(
      "ratio = a row's time / its series' first row's time; error = predicted / measured"
      " - 1;\na trend step is right when both go the same way (a step under %.0f %% is"
      " flat)\n",
      100 * kFlatStep);
  for (const SetResult& result : results) {
    std::printf("\n%s (%s)\n", result.set.name.c_str(),
                result.set.role.empty() ? "no role" : result.set.role.c_str());
    std::printf("  %-62s %9s %9s %8s\n", "configuration", "measured", "predicted", "error");
    for (const RatioCheck& check : result.ratios) {
      std::printf("  %-62s %9.3f %9.3f %7.1f%%\n", check.label.c_str(), check.measured,
                  check.predicted, 100 * check.error());
    }
  }
  std::printf("\n%-30s %-12s %7s %13s %10s %13s\n", "set", "role", "ratios", "median |err|",
              "max |err|", "trends right");
  for (const SetResult& result : results) {
    std::printf("%-30s %-12s %7zu %12.1f%% %9.1f%% %8d of %d\n", result.set.name.c_str(),
                result.set.role.c_str(), result.ratios.size(), 100 * result.median_error,
                100 * result.max_error, result.trends_right, result.trend_steps);
  }
}

}  // namespace

int command_validate(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  const std::string dir = options.get("--dir").value_or(DITOPS_SIM_MEASUREMENTS_DIR);
  std::vector<SetResult> results;
  for (const std::string& path : measurement_files(dir)) {
    sim::MeasurementSet set;
    try {
      set = sim::load_measurement_set(path, hw);
    } catch (const sim::SimError& error) {
      throw UsageError(std::string("--dir ") + error.what());
    }
    results.push_back(check_set(std::move(set), hw));
  }
  if (options.json) {
    print_json(results);
  } else {
    print_tables(results, dir);
  }
  return 0;
}

}  // namespace ditops::tools::sim_cli
