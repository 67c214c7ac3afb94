// ditops-sim fa: prefill flash attention (dense or block-sparse), simulated once.

#include "sim/fa.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"
#include "tools/ditops_sim/run.hpp"

namespace ditops::tools::sim_cli {
namespace {

/// The fa flags, validated; `mode` gets the model the run uses.
sim::FaConfig fa_config(const Options& options, const sim::HwParams& hw, ModeChoice& mode) {
  sim::FaConfig config;
  config.batch = int_flag(options, "--batch", config.batch);
  config.heads = int_flag(options, "--heads", config.heads);
  config.dim = int_flag(options, "--dim", config.dim);
  config.cores = int_flag(options, "--cores", std::min(static_cast<int>(hw.num_cores), 24));
  config.chunk = int_flag(options, "--chunk", config.chunk);
  const std::string dtype = options.get("--dtype").value_or("bf16");
  if (dtype != "bf16" && dtype != "int8") {
    throw UsageError("--dtype must be bf16 or int8 (got '" + dtype + "')");
  }
  config.int8 = dtype == "int8";
  config.opts = parse_opts(options);
  if (const auto video = options.get("--video")) {
    if (options.get("--density")) throw UsageError("--density and --video exclude each other");
    const std::vector<int> extents = parse_list("--video", *video);
    if (extents.size() != 3) throw UsageError("--video expects T,H,W (got '" + *video + "')");
    config.rainfusion = true;
    config.frames = extents[0];
    config.height = extents[1];
    config.width = extents[2];
    config.text = int_flag(options, "--text", 0);
    if (const auto sparsity = options.get("--sparsity")) {
      config.sparsity = parse_double("--sparsity", *sparsity);
    }
    if (const auto patterns = options.get("--pattern")) {
      try {
        config.patterns = sim::parse_fa_patterns(*patterns);
      } catch (const sim::SimError& error) {
        throw UsageError(std::string("--pattern: ") + error.what());
      }
    }
    const long long tokens =
        static_cast<long long>(config.frames) * config.height * config.width + config.text;
    config.seq = tokens > (1 << 20) ? (1 << 20) + 1 : static_cast<int>(tokens);
  } else {
    for (const char* flag : {"--text", "--sparsity", "--pattern"}) {
      if (options.get(flag)) throw UsageError(std::string(flag) + " needs --video");
    }
    if (const auto density = options.get("--density")) {
      config.density = parse_double("--density", *density);
    }
  }
  config.seq = int_flag(options, "--seq", config.seq);
  config.kv_seq = int_flag(options, "--kv-seq", 0);
  try {
    sim::validate(config, hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--") + error.what());
  }
  mode = choose_mode(
      options,
      [&](sim::SimMode candidate) {
        sim::FaConfig sized = config;
        sized.mode = candidate;
        return sim::estimate_fa_instructions(sized, hw);
      },
      sim::describe(config));
  config.mode = mode.mode;
  return config;
}

}  // namespace

int command_fa(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  ModeChoice mode;
  const sim::FaConfig config = fa_config(options, hw, mode);
  sim::FaPlan plan;
  const Run run = simulate(sim::build_fa_program(config, hw, &plan), hw, wants_files(options));
  const std::string title = "ditops-sim fa: " + sim::describe(config);
  write_run_files(options, run, hw, title);
  std::string masks;
  for (const std::string& name : plan.mask_names) masks += (masks.empty() ? "" : ",") + name;
  if (!options.json) {
    char kept[32];
    std::snprintf(kept, sizeof kept, "%.3f", plan.kept_share);
    const std::string plan_line = "plan: " + std::to_string(plan.tasks.size()) +
                                  " tasks (batch x heads x " + std::to_string(plan.q_tiles) +
                                  " query tiles of 128) on " + std::to_string(plan.cores_used) +
                                  " cores, " + std::to_string(plan.kv_blocks) + " KV blocks, " +
                                  std::to_string(plan.kv_tile_tokens) + " keys per stage, masks " +
                                  masks + ", kept share " + kept;
    std::cout << sim::format_table(run.summary,
                                   title + "\n" + mode_line(mode) + "\n" + plan_line + "\n");
    if (config.rainfusion) {
      const sim::FaBreakdown breakdown =
          sim::rainfusion_breakdown(config, hw, plan, run.summary.time_us);
      std::printf(
          "\nRainFusion: ideal speedup over dense 1 / (1 - %s) = %.2fx; where the time "
          "goes (sim/README.md):\n",
          sim::number_text(config.sparsity).c_str(), breakdown.ideal_speedup);
      for (const auto& [name, us] : breakdown.parts) {
        std::printf("  %-62s %12.1f us  %5.1f%%\n", name.c_str(), us,
                    100 * us / run.summary.time_us);
      }
    }
    return 0;
  }
  nlohmann::ordered_json head;
  head["mode"] = sim::sim_mode_name(config.mode);
  if (!mode.reason.empty()) head["mode_reason"] = mode.reason;
  head["config"] = {{"batch", config.batch},
                    {"heads", config.heads},
                    {"seq", config.seq},
                    {"kv_seq", config.kv_seq > 0 ? config.kv_seq : config.seq},
                    {"dim", config.dim},
                    {"dtype", config.int8 ? "int8" : "bf16"},
                    {"cores", config.cores},
                    {"chunk", config.chunk},
                    {"opts", sim::mla_opts_to_string(config.opts)}};
  head["plan"] = {{"tasks", plan.tasks.size()},    {"q_tiles", plan.q_tiles},
                  {"kv_blocks", plan.kv_blocks},   {"kv_tile_tokens", plan.kv_tile_tokens},
                  {"cores_used", plan.cores_used}, {"masks", plan.mask_names},
                  {"kept_share", plan.kept_share}};
  if (config.rainfusion) {
    const sim::FaBreakdown breakdown =
        sim::rainfusion_breakdown(config, hw, plan, run.summary.time_us);
    nlohmann::ordered_json parts = nlohmann::ordered_json::object();
    for (const auto& [name, us] : breakdown.parts) parts[name] = us;
    head["rainfusion"] = {{"sparsity", config.sparsity},
                          {"ideal_speedup", breakdown.ideal_speedup},
                          {"time_us_by_part", parts}};
  }
  print_run_json(head, run.summary);
  return 0;
}

}  // namespace ditops::tools::sim_cli
