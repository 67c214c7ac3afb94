// ditops-sim mla: the int8 MLA paged-decode kernel, simulated once.

#include "sim/mla.hpp"

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"
#include "tools/ditops_sim/run.hpp"

namespace ditops::tools::sim_cli {

sim::MlaConfig mla_config(const Options& options, const sim::HwParams& hw) {
  sim::MlaConfig config;
  config.cores = int_flag(options, "--cores", std::min(static_cast<int>(hw.num_cores), 24));
  config.heads = int_flag(options, "--heads", config.heads);
  config.q_len = int_flag(options, "--q-len", config.q_len);
  config.block_size = int_flag(options, "--block-size", config.block_size);
  if (options.is("mla")) {
    config.batch = int_flag(options, "--batch", config.batch);
    config.kv = int_flag(options, "--kv", config.kv);
    config.chunk = int_flag(options, "--chunk", config.chunk);
  }
  config.opts = parse_opts(options);
  return config;
}

ModeChoice validate_config(sim::MlaConfig& config, const sim::HwParams& hw,
                           const Options& options) {
  try {
    sim::validate(config, hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--") + error.what());
  }
  const ModeChoice choice = choose_mode(
      options,
      [&](sim::SimMode mode) {
        sim::MlaConfig sized = config;
        sized.mode = mode;
        return sim::estimate_mla_instructions(sized, hw);
      },
      sim::describe(config));
  config.mode = choice.mode;
  return choice;
}

namespace {

std::string plan_text(const sim::MlaConfig& config, const sim::MlaPlan& plan) {
  std::string text = "plan: " + std::to_string(config.batch) + " sequence(s) x " +
                     std::to_string(plan.head_groups) + " head group(s) of " +
                     std::to_string(plan.heads_per_group) + " heads x " +
                     std::to_string(plan.splits) +
                     " KV split(s) = " + std::to_string(plan.tasks.size()) + " tasks on " +
                     std::to_string(plan.cores_used) + " cores, " +
                     std::to_string(plan.blocks_per_sequence) + " blocks per sequence";
  if (plan.combine) text += ", combine pass";
  return text;
}

}  // namespace

int command_mla(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  sim::MlaConfig config = mla_config(options, hw);
  const ModeChoice mode = validate_config(config, hw, options);
  sim::MlaPlan plan;
  const Run run = simulate(sim::build_mla_program(config, hw, &plan), hw, wants_files(options));
  const std::string title = "ditops-sim mla: " + sim::describe(config);
  write_run_files(options, run, hw, title);
  if (!options.json) {
    std::cout << sim::format_table(
        run.summary, title + "\n" + mode_line(mode) + "\n" + plan_text(config, plan) + "\n");
    return 0;
  }
  nlohmann::ordered_json head;
  head["mode"] = sim::sim_mode_name(config.mode);
  if (!mode.reason.empty()) head["mode_reason"] = mode.reason;
  head["config"] = {{"batch", config.batch}, {"kv", config.kv},
                    {"heads", config.heads}, {"q_len", config.q_len},
                    {"cores", config.cores}, {"block_size", config.block_size},
                    {"chunk", config.chunk}, {"opts", sim::mla_opts_to_string(config.opts)}};
  head["plan"] = {{"tasks", plan.tasks.size()},
                  {"splits", plan.splits},
                  {"head_groups", plan.head_groups},
                  {"cores_used", plan.cores_used},
                  {"combine", plan.combine}};
  print_run_json(head, run.summary);
  return 0;
}

}  // namespace ditops::tools::sim_cli
