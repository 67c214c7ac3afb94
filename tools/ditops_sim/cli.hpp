#pragma once
// ditops-sim's command table and argument parsing (cli.cpp): every command's flags with their
// values and defaults, the --help texts, the parsed Options and the value parsers the commands
// share. A mistake in the arguments is a UsageError.

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace ditops::tools::sim_cli {

namespace sim = ditops::sim;

/// A command-line mistake: one line on stderr, exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FlagSpec {
  const char* name;
  const char* value;     // what the value looks like; nullptr for a switch (--json)
  const char* fallback;  // the default, "" when there is none
  const char* help;
};

struct CommandSpec {
  const char* name;
  const char* summary;
  std::vector<FlagSpec> flags;
};

/// The --help text of one command.
std::string command_help(const CommandSpec& command);
/// The usage text: every command with its summary.
std::string general_usage();

struct Options {
  const CommandSpec* command = nullptr;
  std::map<std::string, std::string> values;  // flag -> raw value
  bool json = false;
  bool help = false;

  std::optional<std::string> get(const std::string& flag) const {
    const auto found = values.find(flag);
    if (found == values.end()) return std::nullopt;
    return found->second;
  }
  bool is(const char* name) const { return std::string(command->name) == name; }
};

/// The command (argv[1]) and its flags; a help flag stops the parse.
Options parse_args(int argc, char** argv);

std::vector<int> parse_list(const std::string& flag, const std::string& text);

/// The integer flag's value, or `fallback` when it is not given.
int int_flag(const Options& options, const char* flag, int fallback);

// --hw FILE, then --set NAME=VALUE[,NAME=VALUE...] overrides (for sensitivity sweeps).
sim::HwParams load_hw(const Options& options);

sim::MlaOptimizations parse_opts(const Options& options);

double parse_double(const std::string& flag, const std::string& text);

}  // namespace ditops::tools::sim_cli
