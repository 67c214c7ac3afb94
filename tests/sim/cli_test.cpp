// The built ditops-sim against its documented CLI (the usage text): outputs parse, and bad flags or
// values exit with status 2 and exactly one line on stderr.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct CliRun {
  int status = -1;
  std::string out;
  std::string err;
};

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string read_file(const std::string& path) {
  std::ifstream file(path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

// Each run is limited to 120 s (status 124 past it): a hang fails its test, and no simulator
// is left running when ctest's TIMEOUT ends the test.
CliRun run(const std::string& args) {
  const std::string dir = env("DITOPS_SIM_TMP");
  const std::string out = dir + "/cli_out.txt";
  const std::string err = dir + "/cli_err.txt";
  const std::string command = "timeout -k 5 120 '" + env("DITOPS_SIM_CLI") + "' " + args + " >'" +
                              out + "' 2>'" + err + "'";
  CliRun result;
  const int raw = std::system(command.c_str());
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  result.out = read_file(out);
  result.err = read_file(err);
  return result;
}

int lines(const std::string& text) {
  int count = 0;
  for (const char c : text) count += c == '\n';
  return count;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env("DITOPS_SIM_CLI").empty() || env("DITOPS_SIM_TMP").empty()) {
      GTEST_FAIL() << "DITOPS_SIM_CLI and DITOPS_SIM_TMP must be set (ctest sets them)";
    }
  }
  void expect_usage_error(const std::string& args, const std::string& mentions) {
    const CliRun result = run(args);
    EXPECT_EQ(result.status, 2) << args;
    EXPECT_EQ(lines(result.err), 1) << args << ": " << result.err;
    EXPECT_NE(result.err.find(mentions), std::string::npos) << args << ": " << result.err;
    EXPECT_TRUE(result.out.empty()) << args;
  }
  std::string write_tmp(const std::string& name, const std::string& text) {
    const std::string path = env("DITOPS_SIM_TMP") + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(Cli, BadFlagsAndValuesExit2WithOneLine) {
  expect_usage_error("mla --chunk 3", "chunk");
  expect_usage_error("mla --batch 0", "batch");
  expect_usage_error("mla --batch -1", "batch");
  expect_usage_error("mla --kv 12x", "--kv");
  expect_usage_error("mla --block-size 96", "block-size");
  expect_usage_error("mla --cores 99", "cores");
  expect_usage_error("mla --opt warp_speed", "warp_speed");
  expect_usage_error("mla --frobnicate 1", "--frobnicate");
  expect_usage_error("mla --batch", "--batch");
  expect_usage_error("sweep --chunk 1,3", "chunk");
  expect_usage_error("sweep --batch 1,,2", "--batch");
  expect_usage_error("sweep --trace x.json", "--trace");
  expect_usage_error("fly", "fly");
  expect_usage_error("", "command");
}

TEST_F(Cli, MalformedHardwareJsonExits2) {
  expect_usage_error("mla --hw " + write_tmp("broken.json", "{\"format\": "), "--hw");
  expect_usage_error("mla --hw /nonexistent/hw.json", "--hw");
  // Valid JSON, but a missing parameter, an unknown one, a wrong type, a wrong unit.
  const CliRun hw = run("hw");
  ASSERT_EQ(hw.status, 0);
  nlohmann::json base = nlohmann::json::parse(hw.out);
  nlohmann::json missing = base;
  missing["params"].erase("clock_ghz");
  expect_usage_error("mla --hw " + write_tmp("missing.json", missing.dump()), "clock_ghz");
  nlohmann::json unknown = base;
  unknown["params"]["warp_factor"] = {{"value", 9}, {"unit", "x"}, {"source", "U"}};
  expect_usage_error("mla --hw " + write_tmp("unknown.json", unknown.dump()), "warp_factor");
  nlohmann::json wrong_type = base;
  wrong_type["params"]["l1_bytes"]["value"] = "512K";
  expect_usage_error("sweep --hw " + write_tmp("type.json", wrong_type.dump()), "l1_bytes");
  nlohmann::json wrong_unit = base;
  wrong_unit["params"]["clock_ghz"]["unit"] = "MHz";
  expect_usage_error("mla --hw " + write_tmp("unit.json", wrong_unit.dump()), "MHz");
  nlohmann::json negative = base;
  negative["params"]["hbm_bandwidth_bytes_per_cycle"]["value"] = -5;
  expect_usage_error("mla --hw " + write_tmp("negative.json", negative.dump()), "hbm_bandwidth");
  // A number beyond double's range: the JSON library's out_of_range, which escaped as exit 1.
  nlohmann::json huge = base;
  huge["params"]["clock_ghz"]["value"] = 123456.5;
  std::string huge_text = huge.dump();
  huge_text.replace(huge_text.find("123456.5"), 8, "1e400");
  expect_usage_error("mla --hw " + write_tmp("huge.json", huge_text), "--hw");
}

// Values that passed the old checks and made the engine run forever (a transfer's remainder below
// one rounding step of the clock) or print a 300-digit time: each is outside its range.
TEST_F(Cli, ParametersOutsideTheirRangeExit2) {
  for (const std::string set : {"hbm_bandwidth_bytes_per_cycle=1e-4", "hbm_latency_cycles=1e10",
                                "cube_int8_macs_per_cycle=1e-12", "vector_bytes_per_cycle=1e-12",
                                "mte2_small_copy_head_cycles=1e12", "clock_ghz=0x1p-1000",
                                "num_cores=2.5", "kernel_launch_us=nan"}) {
    expect_usage_error("mla --set " + set, set.substr(0, set.find('=')) + " must be");
    EXPECT_LT(run("mla --set " + set).err.size(), 200u) << set;
  }
  const CliRun hw = run("hw");
  ASSERT_EQ(hw.status, 0);
  nlohmann::json slow = nlohmann::json::parse(hw.out);
  slow["params"]["hbm_bandwidth_bytes_per_cycle"]["value"] = 1e-4;
  expect_usage_error("sweep --hw " + write_tmp("slow.json", slow.dump()),
                     "hbm_bandwidth_bytes_per_cycle must be a number in [1, 1048576] B/cycle "
                     "(got 0.0001)");
}

TEST_F(Cli, HwPrintsAValidHwFileWithUnitsAndSources) {
  const CliRun hw = run("hw");
  ASSERT_EQ(hw.status, 0) << hw.err;
  const nlohmann::json json = nlohmann::json::parse(hw.out);
  ASSERT_TRUE(json["params"].is_object());
  for (const auto& [name, entry] : json["params"].items()) {
    EXPECT_TRUE(entry["value"].is_number()) << name;
    EXPECT_FALSE(entry["unit"].get<std::string>().empty()) << name;
    const std::string source = entry["source"].get<std::string>();
    EXPECT_TRUE(source.rfind("H:", 0) == 0 || source.rfind("M:", 0) == 0 ||
                source.rfind("U:", 0) == 0)
        << name << ": " << source;
  }
  for (const auto& [name, entry] : json["params"].items()) {
    ASSERT_TRUE(entry["range"].is_array() && entry["range"].size() == 2) << name;
    EXPECT_LE(entry["range"][0].get<double>(), entry["value"].get<double>()) << name;
    EXPECT_GE(entry["range"][1].get<double>(), entry["value"].get<double>()) << name;
  }
  const std::string path = write_tmp("defaults.json", hw.out);
  const CliRun again = run("hw --hw " + path);
  EXPECT_EQ(again.status, 0);
  EXPECT_EQ(again.out, hw.out);
}

TEST_F(Cli, MlaJsonHasTheContractFields) {
  const CliRun result = run("mla --batch 2 --kv 512 --chunk 4 --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_GT(json["time_us"].get<double>(), 0);
  EXPECT_GT(json["cycles"].get<double>(), 0);
  ASSERT_TRUE(json["pipes"].is_object());
  for (const char* pipe :
       {"AIC.MTE2", "AIC.MTE1", "AIC.M", "AIC.FIX", "AIV.MTE2", "AIV.V", "AIV.MTE3"}) {
    const double ratio = json["pipes"][pipe].get<double>();
    EXPECT_GE(ratio, 0) << pipe;
    EXPECT_LE(ratio, 1) << pipe;
  }
  ASSERT_TRUE(json["bubbles"].is_object());
  EXPECT_TRUE(json["bubbles"].contains("AIC"));
  EXPECT_TRUE(json["bubbles"].contains("AIV"));
  EXPECT_NEAR(json["time_us"].get<double>() * 1800.0, json["cycles"].get<double>(), 1e-6);
}

TEST_F(Cli, SweepJsonIsAnArrayOfRuns) {
  const CliRun result = run("sweep --batch 1,2 --kv 512 --chunk 1,4 --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_TRUE(json.is_array());
  ASSERT_EQ(json.size(), 4u);
  for (const auto& item : json) {
    for (const char* key : {"batch", "kv", "chunk", "time_us"}) {
      EXPECT_TRUE(item.contains(key)) << key;
    }
  }
  EXPECT_EQ(json[1]["chunk"], 4);
  EXPECT_DOUBLE_EQ(json[0]["ratio_to_chunk1"].get<double>(), 1.0);
}

TEST_F(Cli, SweepTableShowsRatiosToChunk1) {
  const CliRun result = run("sweep --batch 1 --kv 512,1024");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.out.find("chunk=1"), std::string::npos);
  EXPECT_NE(result.out.find("chunk=4"), std::string::npos);
  EXPECT_NE(result.out.find("(x1.000)"), std::string::npos);
}

// --cpu: the CPU kernel's chunk ratios beside the simulator's, from Google Benchmark JSON
// (times in us, the median of repeated runs; entries of other heads or threads ignored).
TEST_F(Cli, SweepPutsCpuRatiosBesideTheSimulators) {
  nlohmann::json bench;
  bench["benchmarks"] = nlohmann::json::array();
  auto entry = [&](int batch, int chunk, int threads, double us) {
    bench["benchmarks"].push_back(
        {{"name", "mla_grid/b:" + std::to_string(batch) +
                      "/kv:512/h:128/chunk:" + std::to_string(chunk) +
                      "/threads:" + std::to_string(threads) + "/splits:0/min_time:0.050/real_time"},
         {"run_type", "iteration"},
         {"real_time", us},
         {"time_unit", "us"}});
  };
  entry(1, 1, 2, 100.0);
  entry(1, 2, 2, 90.0);
  entry(1, 2, 2, 80.0);
  entry(1, 2, 2, 70.0);  // median of 90, 80, 70: 80
  entry(1, 4, 2, 40.0);
  entry(1, 4, 2, 60.0);  // median of two: their mean, 50
  entry(1, 4, 1, 10.0);  // one thread: not the default --cpu-threads 2
  const std::string path = write_tmp("cpu.json", bench.dump());
  const CliRun result = run("sweep --batch 1 --kv 512 --cpu '" + path + "' --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json.size(), 3u);
  EXPECT_DOUBLE_EQ(json[0]["cpu_ratio_to_chunk1"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(json[1]["cpu_time_us"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(json[1]["cpu_ratio_to_chunk1"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(json[2]["cpu_ratio_to_chunk1"].get<double>(), 0.5);
  const CliRun table = run("sweep --batch 1 --kv 512 --cpu '" + path + "'");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("CPU us"), std::string::npos);
  EXPECT_NE(table.out.find("(x0.800)"), std::string::npos);
  const CliRun missing = run("sweep --batch 1 --kv 512 --cpu '" + path + ".none'");
  EXPECT_EQ(missing.status, 2);
  EXPECT_EQ(lines(missing.err), 1);
  const CliRun empty = run("sweep --cpu '" + write_tmp("empty.json", "{}") + "'");
  EXPECT_EQ(empty.status, 2);
  EXPECT_NE(empty.err.find("no mla_grid"), std::string::npos);
  expect_usage_error("sweep --cpu '" + write_tmp("array.json", "[1, 2]") + "'", "Google Benchmark");
  expect_usage_error(
      "sweep --cpu '" + write_tmp("bad_name.json", R"({"benchmarks": [{"name": 3}]})") + "'",
      "entry '#0': field 'name' is not a string");
  expect_usage_error("sweep --cpu-threads 1", "--cpu-threads needs --cpu");
}

// Google Benchmark writes the coefficient of variation of a counter that is 0 in every
// repetition as NaN (0/0), which is not JSON: such fields are left out with one warning line
// each, never the file. A string that says NaN is not a number token and stays.
TEST_F(Cli, SweepCpuLeavesOutNonFiniteFieldsWithAWarning) {
  const std::string name = "mla_grid/b:1/kv:512/h:128/chunk:";
  const auto entry = [&](int chunk, const std::string& run_type, const std::string& extra) {
    return R"({"name": ")" + name + std::to_string(chunk) +
           R"(/threads:2/real_time", "run_type": ")" + run_type + R"(", "real_time": )" +
           std::to_string(100 - 10 * chunk) +
           R"(, "time_unit": "us", "label": "NaN is a word here")" + extra + "}";
  };
  const std::string path =
      write_tmp("cpu_nan.json",
                R"({"benchmarks": [)" + entry(1, "iteration", R"(, "frac_int8": NaN)") + "," +
                    entry(2, "iteration", "") + "," +
                    entry(4, "aggregate", R"(, "frac_int8": -nan, "GOP/s": Infinity)") + "]}");
  const CliRun result = run("sweep --batch 1 --kv 512 --chunk 1,2 --cpu '" + path + "' --json");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(lines(result.err), 3) << result.err;
  EXPECT_NE(result.err.find("'" + path + "': entry '" + name +
                            "1/threads:2/real_time': field 'frac_int8'"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("field 'GOP/s'"), std::string::npos) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json.size(), 2u);
  EXPECT_DOUBLE_EQ(json[1]["cpu_ratio_to_chunk1"].get<double>(), 80.0 / 90.0);
}

TEST_F(Cli, SweepCpuRejectsMalformedFilesAndNamesTheEntryAndField) {
  expect_usage_error("sweep --cpu '" +
                         write_tmp("truncated.json", R"({"benchmarks": [{"name": "mla_grid/b:1")") +
                         "'",
                     "is not Google Benchmark JSON");
  const std::string entry =
      R"({"benchmarks": [{"name": "mla_grid/b:1/kv:512/h:128/chunk:1/threads:2", )";
  expect_usage_error(
      "sweep --cpu '" +
          write_tmp("unit.json", entry + R"("real_time": 5, "time_unit": "fortnights"}]})") + "'",
      "entry 'mla_grid/b:1/kv:512/h:128/chunk:1/threads:2': field 'time_unit'");
  expect_usage_error(
      "sweep --cpu '" + write_tmp("type.json", entry + R"("real_time": "fast"}]})") + "'",
      "entry 'mla_grid/b:1/kv:512/h:128/chunk:1/threads:2': field 'real_time' is not a number");
  expect_usage_error("sweep --cpu '" + write_tmp("entry.json", R"({"benchmarks": [3]})") + "'",
                     "entry #0 is not an object");
}

// Input files are read only when they are regular files: a directory said "malformed JSON"
// (--hw) or ended in a bare library message with status 1 (--cpu), and a FIFO blocked forever.
TEST_F(Cli, InputsThatAreNotRegularFilesExit2NamingThem) {
  const std::string dir = env("DITOPS_SIM_TMP") + "/not_a_file.d";
  std::filesystem::create_directories(dir);
  const std::string fifo = env("DITOPS_SIM_TMP") + "/input.fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {dir, fifo}) {
    const std::string kind = path == dir ? "is a directory" : "is a FIFO";
    expect_usage_error("mla --hw '" + path + "'",
                       "hardware file " + path + ": it " + kind + ", not a regular file");
    expect_usage_error("sweep --cpu '" + path + "'",
                       "cannot read '" + path + "': it " + kind + ", not a regular file");
  }
  std::filesystem::remove(fifo);
}

// A time that overflows to infinity in us (1e308 s) was printed as null in the JSON output.
TEST_F(Cli, SweepCpuLeavesOutInfiniteTimes) {
  nlohmann::json bench;
  bench["benchmarks"] = nlohmann::json::array();
  for (const auto& [chunk, seconds] : {std::pair{1, 1e308}, std::pair{2, 1e-4}}) {
    bench["benchmarks"].push_back(
        {{"name", "mla_grid/b:1/kv:512/h:128/chunk:" + std::to_string(chunk) + "/threads:2"},
         {"real_time", seconds},
         {"time_unit", "s"}});
  }
  const std::string path = write_tmp("cpu_inf.json", bench.dump());
  const CliRun result = run("sweep --batch 1 --kv 512 --chunk 1,2 --cpu '" + path + "' --json");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(lines(result.err), 1) << result.err;
  EXPECT_NE(result.err.find("chunk:1/threads:2': field 'real_time' is not a finite number"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(result.out.find("null"), std::string::npos) << result.out;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_FALSE(json[0].contains("cpu_time_us"));
  EXPECT_DOUBLE_EQ(json[1]["cpu_time_us"].get<double>(), 100.0);
}

// The program's size is estimated before it is built: batch 4096 x kv 1M x 1024 heads would need
// ~1e11 instructions (the old CLI grew past 2.7 GB building it).
// Above the limit --mode auto runs coarse; a coarse program above it is refused the same way.
TEST_F(Cli, ProgramsAboveTheInstructionLimitExit2BeforeTheyAreBuilt) {
  expect_usage_error("mla --batch 4096 --kv 1048576 --heads 1024 --mode fine",
                     "instructions, more than the limit of 30000000");
  expect_usage_error("mla --batch 4096 --kv 1048576 --heads 1024",
                     "stage events in coarse mode, more than the limit of 30000000");
  expect_usage_error("sweep --batch 1,4096 --kv 1048576", "raise it with --max-instructions N");
  expect_usage_error("mla --batch 2 --kv 512 --max-instructions 1000 --mode fine",
                     "batch 2, kv 512, heads 128, q-len 1, block 128, cores 24, chunk 2, opts "
                     "none needs about ");
  EXPECT_EQ(run("mla --batch 2 --kv 512 --max-instructions 100000 --json").status, 0);
  EXPECT_EQ(run("mla --batch 2 --kv 512 --max-instructions 1000 --json").status, 0);
  expect_usage_error("mla --max-instructions lots", "--max-instructions expects");
}

TEST_F(Cli, MlaWritesTraceCsvAndSvg) {
  const std::string dir = env("DITOPS_SIM_TMP");
  const CliRun result = run("mla --batch 1 --kv 2048 --chunk 2 --trace '" + dir +
                            "/t.json' --csv '" + dir + "/p.csv' --svg '" + dir + "/g.svg'");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.out.find("bubbles"), std::string::npos);
  const nlohmann::json trace = nlohmann::json::parse(read_file(dir + "/t.json"));
  int complete = 0, flows_start = 0, flows_end = 0, thread_names = 0;
  for (const auto& event : trace["traceEvents"]) {
    const std::string ph = event["ph"];
    complete += ph == "X";
    flows_start += ph == "s";
    flows_end += ph == "f";
    thread_names += ph == "M" && event["name"] == "thread_name";
  }
  EXPECT_GT(complete, 100);
  EXPECT_GT(flows_start, 0);
  EXPECT_EQ(flows_start, flows_end);
  EXPECT_EQ(thread_names % 10, 0);  // ten pipes per core
  const std::string csv = read_file(dir + "/p.csv");
  EXPECT_EQ(csv.rfind("core_id,aic_total_time(us),aic_total_cycles,aic_mac_time(us)", 0), 0u);
  EXPECT_NE(csv.find("\nmean,"), std::string::npos);
  const std::string svg = read_file(dir + "/g.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("time (us)"), std::string::npos);
  EXPECT_NE(svg.find("url(#bubble)"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace

namespace {

// The flags of each command as the documented CLI lists them.
const std::map<std::string, std::vector<std::string>>& documented_flags() {
  static const std::map<std::string, std::vector<std::string>> flags = {
      {"mla",
       {"--batch", "--kv", "--heads", "--q-len", "--cores", "--block-size", "--chunk", "--opt",
        "--hw", "--trace", "--csv", "--svg", "--json"}},
      {"sweep", {"--batch", "--kv", "--chunk", "--heads", "--opt", "--hw", "--json"}},
      {"fa",
       {"--batch", "--heads", "--seq", "--kv-seq", "--dim", "--dtype", "--cores", "--chunk",
        "--density", "--video", "--text", "--sparsity", "--opt", "--hw", "--trace", "--csv",
        "--svg", "--json"}},
      {"hw", {"--hw", "--set"}},
      {"calibrate", {"--measured", "--hw", "--fit", "--out", "--json"}},
      {"validate", {"--dir", "--hw", "--set", "--json"}},
  };
  return flags;
}

}  // namespace

TEST_F(Cli, EveryCommandDocumentsItsFlagsAndRejectsUnknownOnes) {
  for (const auto& [command, flags] : documented_flags()) {
    const CliRun help = run(command + " --help");
    EXPECT_EQ(help.status, 0) << command;
    EXPECT_TRUE(help.err.empty()) << command << ": " << help.err;
    for (const std::string& flag : flags) {
      EXPECT_NE(help.out.find("  " + flag + " "), std::string::npos) << command << " " << flag;
    }
    expect_usage_error(command + " --frobnicate 1", "--frobnicate");
  }
  const CliRun general = run("--help");
  EXPECT_EQ(general.status, 0);
  for (const auto& [command, flags] : documented_flags()) {
    EXPECT_NE(general.out.find("  " + command + " "), std::string::npos) << command;
  }
}

TEST_F(Cli, FaJsonHasTheContractFields) {
  for (const std::string args :
       {"fa --seq 512 --heads 2 --chunk 1 --json", "fa --seq 640 --heads 2 --density 0.5 --json",
        "fa --video 3,8,12 --text 64 --sparsity 0.5 --heads 3 --chunk 4 --dtype int8 --json"}) {
    const CliRun result = run(args);
    ASSERT_EQ(result.status, 0) << args << ": " << result.err;
    const nlohmann::json json = nlohmann::json::parse(result.out);
    for (const char* key : {"time_us", "cycles", "pipes", "bubbles", "plan", "config"}) {
      EXPECT_TRUE(json.contains(key)) << args << " " << key;
    }
    EXPECT_GT(json["time_us"].get<double>(), 0);
    EXPECT_TRUE(json["pipes"].contains("AIC.M")) << args;
    EXPECT_TRUE(json["bubbles"].contains("AIV")) << args;
  }
  const CliRun table = run("fa --seq 512 --heads 2");
  EXPECT_EQ(table.status, 0);
  EXPECT_NE(table.out.find("bubbles"), std::string::npos);
}

TEST_F(Cli, FaBadValuesExit2) {
  expect_usage_error("fa --dtype fp8", "--dtype");
  expect_usage_error("fa --chunk 3", "chunk");
  expect_usage_error("fa --density 0", "density");
  expect_usage_error("fa --density 1.5", "density");
  expect_usage_error("fa --density nan", "--density");
  expect_usage_error("fa --video 2,3", "--video");
  expect_usage_error("fa --video 2,4,4 --density 0.5", "--density");
  expect_usage_error("fa --sparsity 0.5", "--sparsity needs --video");
  expect_usage_error("fa --video 2,4,4 --pattern diagonal", "diagonal");
  expect_usage_error("fa --video 2,4,4 --seq 100", "seq");
  expect_usage_error("fa --dim 100", "dim");
  // Hostile sizes are refused before anything is built.
  expect_usage_error("fa --seq 1048576", "pairs");
  expect_usage_error("fa --batch 4096 --heads 1024 --seq 65536", "instructions");
}

// --mode: fine, coarse, or auto (fine unless the fine program would exceed --max-instructions);
// the report and --json (key "mode") say which ran, and why for auto.
TEST_F(Cli, ModeChoosesTheModelAndReportsIt) {
  const auto json_of = [&](const std::string& args) {
    const CliRun result = run(args + " --json");
    EXPECT_EQ(result.status, 0) << args << ": " << result.err;
    return result.status == 0 ? nlohmann::json::parse(result.out) : nlohmann::json();
  };
  EXPECT_EQ(json_of("fa --seq 512 --heads 2 --mode fine")["mode"], "fine");
  EXPECT_EQ(json_of("fa --seq 512 --heads 2 --mode coarse")["mode"], "coarse");
  EXPECT_EQ(json_of("mla --mode coarse")["mode"], "coarse");
  const nlohmann::json below = json_of("fa --seq 512 --heads 2");
  EXPECT_EQ(below["mode"], "fine");
  EXPECT_NE(below["mode_reason"].get<std::string>().find("within"), std::string::npos);
  // FLUX needs ~2 M instructions at the fine level: above this limit auto runs coarse.
  const nlohmann::json above = json_of("fa --max-instructions 500000");
  EXPECT_EQ(above["mode"], "coarse");
  EXPECT_NE(above["mode_reason"].get<std::string>().find("above --max-instructions 500000"),
            std::string::npos);
  EXPECT_LT(above["instructions"].get<double>(), 500000);
  for (const auto& row :
       json_of("sweep --batch 1,48 --kv 512 --chunk 1 --max-instructions 50000")) {
    EXPECT_EQ(row["mode"], row["batch"] == 1 ? "fine" : "coarse") << row["batch"];
  }
  const CliRun table = run("fa --max-instructions 500000");
  EXPECT_EQ(table.status, 0);
  EXPECT_NE(table.out.find("mode: coarse"), std::string::npos);
  EXPECT_NE(run("fa --seq 512 --heads 2").out.find("mode: fine"), std::string::npos);
  expect_usage_error("fa --mode medium", "--mode must be fine, coarse or auto");
  expect_usage_error("mla --mode", "--mode needs a value");
  expect_usage_error("fa --mode fine --max-instructions 500000", "use --mode coarse");
  expect_usage_error("fa --mode coarse --max-instructions 1000", "stage events in coarse mode");
}

// RainFusion runs say where the time goes beside the ideal speedup; the parts add up.
TEST_F(Cli, FaRainFusionBreakdownAddsUpToTheTime) {
  const CliRun result = run("fa --video 3,16,24 --text 64 --sparsity 0.8 --heads 3 --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_DOUBLE_EQ(json["rainfusion"]["ideal_speedup"].get<double>(), 5.0);
  double total = 0;
  for (const auto& [name, us] : json["rainfusion"]["time_us_by_part"].items()) {
    EXPECT_GE(us.get<double>(), 0) << name;
    total += us.get<double>();
  }
  EXPECT_NEAR(total, json["time_us"].get<double>(), 1e-6 * json["time_us"].get<double>());
  const CliRun table = run("fa --video 3,16,24 --text 64 --sparsity 0.8 --heads 3");
  EXPECT_NE(table.out.find("ideal speedup over dense 1 / (1 - 0.8) = 5.00x"), std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("text and first-frame keys"), std::string::npos);
  EXPECT_EQ(run("fa --seq 512 --heads 2 --json").out.find("rainfusion"), std::string::npos);
}

TEST_F(Cli, CalibrateFitsAndWritesAHwFile) {
  // Times from the model itself under a slower vector issue: the fit finds it again.
  const CliRun sweep =
      run("sweep --batch 1,4 --kv 512,1024 --chunk 1,4 --set vector_issue_cycles=24 --json");
  ASSERT_EQ(sweep.status, 0) << sweep.err;
  std::string csv = "batch,kv,chunk,opt,time_us\n";
  for (const auto& row : nlohmann::json::parse(sweep.out)) {
    csv += std::to_string(row["batch"].get<int>()) + "," + std::to_string(row["kv"].get<int>()) +
           "," + std::to_string(row["chunk"].get<int>()) + ",none," +
           std::to_string(row["time_us"].get<double>()) + "\n";
  }
  const std::string measured = write_tmp("measured.csv", csv);
  const std::string out = env("DITOPS_SIM_TMP") + "/fitted.json";
  std::filesystem::remove(out);
  const CliRun fit = run("calibrate --measured '" + measured +
                         "' --fit vector_issue_cycles --json --out '" + out + "'");
  ASSERT_EQ(fit.status, 0) << fit.err;
  const nlohmann::json json = nlohmann::json::parse(fit.out);
  for (const char* key : {"params", "rows", "error_before", "error_after"}) {
    EXPECT_TRUE(json.contains(key)) << key;
  }
  EXPECT_EQ(json["rows"].size(), 8u);
  EXPECT_NEAR(json["params"]["vector_issue_cycles"]["fitted"].get<double>(), 24, 0.5);
  EXPECT_LT(json["error_after"].get<double>(), json["error_before"].get<double>());
  // The written file is a valid --hw file carrying the fit.
  const CliRun hw = run("hw --hw '" + out + "'");
  ASSERT_EQ(hw.status, 0) << hw.err;
  EXPECT_NEAR(nlohmann::json::parse(hw.out)["params"]["vector_issue_cycles"]["value"].get<double>(),
              24, 0.5);
  // The table names the rows and the held-out error.
  const CliRun table = run("calibrate --measured '" + measured + "' --fit vector_issue_cycles");
  EXPECT_EQ(table.status, 0);
  EXPECT_NE(table.out.find("held-out"), std::string::npos);
}

TEST_F(Cli, ValidatePredictsEveryMeasurementSetOfADirectory) {
  const std::string dir = env("DITOPS_SIM_TMP") + "/sets.d";
  std::filesystem::remove_all(dir);  // a bad set from an earlier run would stop this one
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/one.csv")
      << "# role: calibration\nkernel,heads,seq,kv_seq,cores,chunk,opt,series,time_us\n"
         "fa,1,128,1024,1,4,none,s,10\nfa,1,128,2048,1,4,none,s,14\nfa,1,128,4096,1,4,none,s,30\n";
  std::ofstream(dir + "/two.csv")
      << "# role: held-out\nbatch,kv,chunk,opt,time_us\n1,512,1,none,30\n";
  std::ofstream(dir + "/notes.txt") << "not a set\n";
  const CliRun result = run("validate --dir '" + dir + "' --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json["sets"].size(), 2u);
  const nlohmann::json& one = json["sets"][0];
  EXPECT_EQ(one["name"], "one");
  EXPECT_EQ(one["role"], "calibration");
  ASSERT_EQ(one["ratios"].size(), 2u);
  EXPECT_NEAR(one["ratios"][0]["measured_ratio"].get<double>(), 1.4, 1e-12);
  EXPECT_GT(one["ratios"][1]["predicted_ratio"].get<double>(),
            one["ratios"][0]["predicted_ratio"].get<double>());
  EXPECT_EQ(one["trend_steps"], 2);
  EXPECT_EQ(one["trends_right"], 2);                // both rise, in the model too
  EXPECT_EQ(json["sets"][1]["ratios"].size(), 0u);  // a plain time is no ratio
  const CliRun table = run("validate --dir '" + dir + "'");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("median |err|"), std::string::npos);
  expect_usage_error("validate --dir '" + dir + "/one.csv'", "not a directory");
  std::filesystem::create_directories(dir + "/empty.d");
  expect_usage_error("validate --dir '" + dir + "/empty.d'", "no *.csv");
  std::ofstream(dir + "/three.csv") << "batch,kv,chunk,opt,time_us\n1,512,3,none,30\n";
  expect_usage_error("validate --dir '" + dir + "'", "column chunk");
}

TEST_F(Cli, CalibrateRejectsMalformedFilesNamingRowAndColumn) {
  const auto bad = [&](const std::string& name, const std::string& csv, const std::string& row,
                       const std::string& column) {
    const std::string path = write_tmp(name, csv);
    expect_usage_error("calibrate --measured '" + path + "'", row);
    expect_usage_error("calibrate --measured '" + path + "'", "column " + column);
  };
  bad("no_chunk.csv", "batch,kv,opt,time_us\n1,512,none,10\n", "row 0", "chunk");
  bad("switch.csv", "batch,kv,chunk,opt,time_us\n1,512,1,warp,10\n", "row 1", "opt");
  bad("negative.csv", "batch,kv,chunk,opt,time_us\n1,512,1,none,10\n1,512,2,none,-1\n", "row 2",
      "time_us");
  expect_usage_error("calibrate", "--measured");
  expect_usage_error("calibrate --measured '" + env("DITOPS_SIM_TMP") + "'", "directory");
  const std::string good = write_tmp("good.csv", "batch,kv,chunk,opt,time_us\n1,512,1,none,30\n");
  expect_usage_error("calibrate --measured '" + good + "' --fit warp_factor", "warp_factor");
  // --out never writes through something that is not a regular file.
  const std::string dir = env("DITOPS_SIM_TMP") + "/not_a_file.d";
  std::filesystem::create_directories(dir);
  expect_usage_error(
      "calibrate --measured '" + good + "' --fit vector_issue_cycles --out '" + dir + "'",
      "not a regular file");
  expect_usage_error("fa --seq 256 --heads 1 --svg '" + dir + "'", "not a regular file");
}
