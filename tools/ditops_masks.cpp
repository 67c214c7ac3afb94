// ditops-masks: SVG pictures of the RainFusion token masks of one layout (spatial, temporal,
// textural), one cell per token pair, or per block of pairs (dark if any is kept) where S is
// above 512, with a legend giving the pattern, S and the density (rainfusion_density). The
// cells come from the same plans the library's masks and kernels read.
//
//   ditops-masks --frames T --height H --width W --text X [--text-last] [--sparsity s]
//                [--stride tau] [--no-dense-first-frame] --out DIR
//
// DIR must be new, empty, or hold only .svg files this tool wrote. Bad arguments: one line on
// stderr and exit 2; a failed write: exit 1.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ditops/sparse.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "ops/sparse/layout.hpp"

namespace {

namespace fs = std::filesystem;
constexpr const char* kMarker = "data-generator=\"ditops-masks\"";
constexpr std::int64_t kMaxCells = 512;
/// Drawing visits every kept token pair (S^2 x density): beyond this the tool would run for
/// minutes, so larger layouts are refused.
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 17;

struct UsageError {
  std::string message;
};

[[noreturn]] void usage_error(const std::string& message) { throw UsageError{message}; }

const char* kUsage =
    "usage: ditops-masks --frames T --height H --width W --text X [--text-last] "
    "[--sparsity s] [--stride tau] [--no-dense-first-frame] --out DIR";

std::int64_t parse_integer(const std::string& flag, const std::string& text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || ptr != end || text.empty()) {
    usage_error(flag + " '" + text + "' is not an integer");
  }
  return value;
}

float parse_float(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(value)) {
    usage_error(flag + " '" + text + "' is not a finite number");
  }
  return static_cast<float>(value);
}

struct Arguments {
  ditops::RainFusionOptions rf;
  std::string out;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  std::map<std::string, std::string> values;
  const std::vector<std::string> with_value = {"--frames",   "--height", "--width", "--text",
                                               "--sparsity", "--stride", "--out"};
  bool text_last = false, no_dense_first_frame = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--text-last") {
      text_last = true;
    } else if (flag == "--no-dense-first-frame") {
      no_dense_first_frame = true;
    } else if (std::find(with_value.begin(), with_value.end(), flag) != with_value.end()) {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      if (values.count(flag)) usage_error(flag + " is given twice");
      values[flag] = argv[++i];
    } else {
      usage_error("unknown argument '" + flag + "' (" + kUsage + ")");
    }
  }
  for (const char* required : {"--frames", "--height", "--width", "--text", "--out"}) {
    if (!values.count(required))
      usage_error(std::string(required) + " is required (" + kUsage + ")");
  }
  ditops::VideoLayout& v = args.rf.video;
  v.frames = parse_integer("--frames", values["--frames"]);
  v.height = parse_integer("--height", values["--height"]);
  v.width = parse_integer("--width", values["--width"]);
  v.text_tokens = parse_integer("--text", values["--text"]);
  v.text_first = !text_last;
  args.rf.dense_first_frame = !no_dense_first_frame;
  if (values.count("--sparsity"))
    args.rf.sparsity = parse_float("--sparsity", values["--sparsity"]);
  if (values.count("--stride")) {
    const std::int64_t stride = parse_integer("--stride", values["--stride"]);
    if (stride < 1 || stride > 1'000'000) usage_error("--stride must be from 1 to 1000000");
    args.rf.textural_stride = static_cast<int>(stride);
  }
  args.out = values["--out"];
  if (args.out.empty()) usage_error("--out is empty");
  return args;
}

/// Whether `path` is an SVG this tool wrote (its opening tag carries the marker).
bool written_by_us(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[512] = {};
  in.read(head, sizeof head - 1);
  const std::string text(head, static_cast<std::size_t>(in.gcount()));
  return text.rfind("<svg", 0) == 0 && text.find(kMarker) != std::string::npos &&
         text.find('>') > text.find(kMarker);
}

/// Refuses a DIR that is not a directory or holds anything but this tool's SVGs; creates it.
void prepare_directory(const fs::path& dir) {
  std::error_code error;
  const fs::file_status status = fs::symlink_status(dir, error);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) usage_error("--out '" + dir.string() + "' is not a directory");
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
      const fs::path& path = entry.path();
      if (!entry.is_regular_file() || entry.is_symlink() || path.extension() != ".svg" ||
          !written_by_us(path)) {
        usage_error("--out '" + dir.string() + "' holds '" + path.filename().string() +
                    "', which ditops-masks did not write: use a new or empty directory");
      }
    }
    if (error) usage_error("--out '" + dir.string() + "' cannot be listed: " + error.message());
    return;
  }
  if (!fs::create_directories(dir, error) && error) {
    usage_error("--out '" + dir.string() + "' cannot be created: " + error.message());
  }
}

std::string layout_text(const ditops::RainFusionOptions& rf, std::int64_t tokens) {
  const ditops::VideoLayout& v = rf.video;
  std::ostringstream text;
  text << "S = " << tokens << ": " << v.text_tokens << " text " << (v.text_first ? "first" : "last")
       << " + " << v.frames << " x " << v.height << " x " << v.width << " video"
       << (rf.dense_first_frame ? ", dense frame 0" : "");
  return text.str();
}

/// The cells of one pattern: cells x cells, 1 where any token pair inside is kept.
std::vector<std::uint8_t> cells_of(const ditops::sparse::PatternPlan& plan, std::int64_t tokens,
                                   std::int64_t cells) {
  std::vector<std::uint8_t> grid(static_cast<std::size_t>(cells * cells), 0);
  std::vector<std::int64_t> cell(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) cell[t] = t * cells / tokens;
  for (std::int64_t q = 0; q < tokens; ++q) {
    std::uint8_t* row = grid.data() + cell[q] * cells;
    const std::int64_t position = plan.position[q];
    const std::int64_t first = plan.window[2 * position], last = plan.window[2 * position + 1];
    for (std::int64_t k = 0; k < plan.sink_end; ++k) row[cell[plan.order[k]]] = 1;
    for (std::int64_t k = std::max(first, plan.sink_end); k < last; ++k) {
      row[cell[plan.order[k]]] = 1;
    }
  }
  return grid;
}

std::string svg_of(ditops::HeadPattern pattern, const ditops::RainFusionOptions& rf,
                   std::int64_t tokens, std::int64_t cells, const std::vector<std::uint8_t>& grid,
                   double density) {
  const std::int64_t pixel = std::max<std::int64_t>(1, kMaxCells / cells);
  const std::int64_t side = cells * pixel, legend = 64, margin = 8;
  const std::int64_t width = std::max<std::int64_t>(side + 2 * margin, 560);
  const std::int64_t height = side + legend + 2 * margin;
  const std::int64_t per_cell = (tokens + cells - 1) / cells;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" " << kMarker << " width=\"" << width
      << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  char density_text[32];
  std::snprintf(density_text, sizeof density_text, "%.4f", density);
  svg << "<text x=\"" << margin << "\" y=\"20\" font-weight=\"bold\">"
      << ditops::pattern_name(pattern) << " pattern, density " << density_text
      << " (kept share of the video x video scores)</text>\n";
  svg << "<text x=\"" << margin << "\" y=\"38\">" << layout_text(rf, tokens) << ", sparsity "
      << rf.sparsity << ", textural stride " << rf.textural_stride << "</text>\n";
  svg << "<text x=\"" << margin << "\" y=\"56\">rows: queries, columns: keys; one cell = "
      << (per_cell == 1 ? std::string("one token pair")
                        : "up to " + std::to_string(per_cell) + " x " + std::to_string(per_cell) +
                              " token pairs, dark if any is kept")
      << "</text>\n";
  const std::int64_t top = legend + margin;
  svg << "<rect x=\"" << margin - 1 << "\" y=\"" << top - 1 << "\" width=\"" << side + 2
      << "\" height=\"" << side + 2 << "\" fill=\"none\" stroke=\"#888\"/>\n";
  svg << "<g fill=\"#1f3b73\" shape-rendering=\"crispEdges\">\n";
  // One rectangle per run of kept cells in a row.
  for (std::int64_t r = 0; r < cells; ++r) {
    const std::uint8_t* row = grid.data() + r * cells;
    for (std::int64_t c = 0; c < cells;) {
      if (!row[c]) {
        ++c;
        continue;
      }
      std::int64_t end = c;
      while (end < cells && row[end]) ++end;
      svg << "<rect x=\"" << margin + c * pixel << "\" y=\"" << top + r * pixel << "\" width=\""
          << (end - c) * pixel << "\" height=\"" << pixel << "\"/>\n";
      c = end;
    }
  }
  svg << "</g>\n</svg>\n";
  return svg.str();
}

int run(const Arguments& args) {
  using ditops::HeadPattern;
  const HeadPattern patterns[] = {HeadPattern::spatial, HeadPattern::temporal,
                                  HeadPattern::textural};
  // Validates the layout and options: an Error ("ditops-masks: rf.sparsity ...") is a bad
  // argument.
  const ditops::sparse::Layout layout = ditops::sparse::checked_layout("ditops-masks", args.rf);
  if (layout.tokens > kMaxTokens) {
    usage_error("the layout has " + std::to_string(layout.tokens) + " tokens; at most " +
                std::to_string(kMaxTokens) + " are drawn");
  }
  std::vector<double> densities;
  for (HeadPattern pattern : patterns) {
    densities.push_back(ditops::rainfusion_density(pattern, args.rf));
  }
  prepare_directory(args.out);
  const std::int64_t cells = std::min(layout.tokens, kMaxCells);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto plan = ditops::sparse::cached_plan(patterns[i], layout);
    const std::string svg = svg_of(patterns[i], args.rf, layout.tokens, cells,
                                   cells_of(*plan, layout.tokens, cells), densities[i]);
    const fs::path path =
        fs::path(args.out) / (std::string(ditops::pattern_name(patterns[i])) + ".svg");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << svg;
    out.close();
    if (!out) {
      std::fprintf(stderr, "ditops-masks: cannot write %s\n", path.string().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& error) {
    std::fprintf(stderr, "ditops-masks: %s\n", error.message.c_str());
    return 2;
  } catch (const ditops::Error& error) {
    std::fprintf(stderr, "%s\n", error.what());  // "ditops-masks: rf.... must be ..."
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ditops-masks: %s\n", error.what());
    return 1;
  }
}
