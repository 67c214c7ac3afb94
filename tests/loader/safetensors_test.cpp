// The safetensors reader and writer: round trips (names, dtypes, shapes, bytes, metadata,
// alignment), every malformed header the reader must refuse with an Error naming the file, the
// tensor and the field, files that are no regular file, and the writer's refusals. Also the
// public writer of TensorViews (ditops::write_safetensors).

#include "loader/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ditops/quant_model.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/loader/files.hpp"
#include "tests/support/temp_dir.hpp"

namespace ditops::test {
namespace {

using loader::SafetensorsEntry;
using loader::SafetensorsFile;

/// Opening `path` throws an Error whose message holds `path` and every one of `needles`.
void expect_open_fails(const std::string& path, const std::vector<std::string>& needles) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no Error for " << path;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks " << needle;
    }
  }
}

TEST(Safetensors, WrittenFilesRoundTrip) {
  const TempDir dir("ditops_safetensors");
  const std::string path = dir / "model.safetensors";
  const std::vector<std::int8_t> i8 = {1, -2, 3};  // odd byte count: tests the layout
  const std::vector<std::int32_t> i32 = {7, -8, 9, 10};
  const std::vector<std::int64_t> i64 = {int64_t{1} << 40};
  const std::vector<float> f32 = {0.5f, -1.25f, 3.f, 4.f, 5.f, 6.f};
  const std::vector<std::uint16_t> half = {0x3c00, 0xc000};  // F16 1, -2
  const std::vector<std::uint16_t> bf = {0x3f80};            // BF16 1
  // The entries view these strings, which outlive them.
  const std::string i8_bytes = bytes_of(i8), i32_bytes = bytes_of(i32), i64_bytes = bytes_of(i64),
                    f32_bytes = bytes_of(f32), half_bytes = bytes_of(half), bf_bytes = bytes_of(bf);
  const std::vector<SafetensorsEntry> tensors = {
      {"a.weight", "I8", {3}, i8_bytes},
      {"a.quant_bias", "I32", {2, 2}, i32_bytes},
      {"a.deq_scale", "I64", {1}, i64_bytes},
      {"b.weight", "F32", {2, 3}, f32_bytes},
      {"b.bias", "F16", {2}, half_bytes},
      {"c", "BF16", {1, 1, 1}, bf_bytes},
      {"empty", "F32", {0, 4}, std::string_view()},
  };
  loader::write_safetensors(path, tensors, {{"format", "pt"}});
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"});  // no temporary left

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a.deq_scale", "a.quant_bias", "a.weight",
                                                    "b.bias", "b.weight", "c", "empty"}));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const SafetensorsEntry& written : tensors) {
    const auto& read = file.get(written.name);
    EXPECT_EQ(read.dtype, written.dtype) << written.name;
    EXPECT_EQ(read.shape, written.shape) << written.name;
    ASSERT_EQ(read.bytes, static_cast<std::int64_t>(written.bytes.size())) << written.name;
    if (read.bytes > 0) {
      EXPECT_EQ(std::memcmp(read.data, written.bytes.data(), written.bytes.size()), 0);
      // Each tensor is aligned to its element size in the page-aligned mapping.
      EXPECT_EQ(
          reinterpret_cast<std::uintptr_t>(read.data) % loader::safetensors_dtype_size(read.dtype),
          0u)
          << written.name;
    }
  }
  EXPECT_EQ(file.get("b.bias").to_floats(path), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(file.get("c").to_floats(path), (std::vector<float>{1.f}));
  const TensorView view = file.get("b.weight").view(path);
  EXPECT_EQ(view.dtype, DType::f32);
  EXPECT_EQ(view.rank, 2);
  EXPECT_EQ(view.shape[1], 3);
  EXPECT_EQ(view.strides[0], 3);
  EXPECT_EQ(static_cast<const float*>(view.data)[4], 5.f);
  EXPECT_EQ(file.find("nope"), nullptr);
  try {
    file.get("nope");
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor \"nope\": missing"), std::string::npos);
  }
  try {
    file.get("a.deq_scale").view(path);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("I64 has no ditops tensor type"), std::string::npos)
        << error.what();
  }

  // Replacing the file keeps the copy that is mapped intact (rename, not overwrite).
  const std::string two = bytes_of(std::vector<float>{2.f});
  loader::write_safetensors(path, {{"x", "F32", {1}, two}});
  EXPECT_EQ(file.get("b.weight").to_floats(path)[0], 0.5f);
  EXPECT_EQ(SafetensorsFile::open(path).names(), std::vector<std::string>{"x"});
}

TEST(Safetensors, MalformedHeadersAreRefused) {
  const TempDir dir("ditops_safetensors");
  const std::string path = dir / "bad.safetensors";
  const std::string f32x2 = std::string(8, '\0');  // two F32 zeros

  std::ofstream(path, std::ios::binary) << "abc";
  expect_open_fails(path, {"is 3 bytes", "8-byte header length"});

  write_raw_safetensors(path, "{}", "", 1000);
  expect_open_fails(path, {"header length 1000 runs past the end of the file"});
  write_raw_safetensors(path, "{}", "", std::uint64_t{1} << 62);
  expect_open_fails(path, {"exceeds the limit"});

  write_raw_safetensors(path, R"({"a": {"dtype": "F32", )", "");
  expect_open_fails(path, {"header is not valid JSON"});
  write_raw_safetensors(path, "[1, 2]", "");
  expect_open_fails(path, {"header is not a JSON object"});

  write_raw_safetensors(path, R"({"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"", "unknown \"dtype\" \"F128\""});
  write_raw_safetensors(path, R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", f32x2);
  expect_open_fails(path, {"tensor \"w\"", "\"dtype\" is missing"});
  write_raw_safetensors(path, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"",
                           "\"shape\" [3] of F32 needs 12 bytes but "
                           "\"data_offsets\" [0, 8] hold 8"});
  write_raw_safetensors(path, R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"", "\"shape\" [-2] has a bad extent"});
  write_raw_safetensors(
      path, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
      f32x2);
  expect_open_fails(path, {"tensor \"w\"", "overflows a byte count"});
  write_raw_safetensors(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"", "\"data_offsets\" [4, 12] run past the end of the file",
                           "holds 8 bytes"});
  write_raw_safetensors(path, R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"", "\"data_offsets\" [8, 4] begin after end"});
  write_raw_safetensors(path, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"w\"", "\"data_offsets\" must be [begin, end]"});
  write_raw_safetensors(path,
                        R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                        R"( "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"v\"", "[4, 8] overlap tensor \"u\"'s [0, 8]"});
  write_raw_safetensors(path,
                        R"({"u": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                        R"( "u": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                        f32x2);
  expect_open_fails(path, {"tensor \"u\"", "named twice"});
  write_raw_safetensors(path,
                        R"({"__metadata__": {"n": 3}, "w": {"dtype": "F32", "shape": [2], )"
                        R"("data_offsets": [0, 8]}})",
                        f32x2);
  expect_open_fails(path, {"\"__metadata__\" entry \"n\" is not a string"});

  // A file cut short: the last tensor's bytes run past its end.
  loader::write_safetensors(path, {{"w", "F32", {2}, f32x2}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  expect_open_fails(path, {"tensor \"w\"", "run past the end of the file", "truncated?"});
}

TEST(Safetensors, OnlyRegularFilesAreOpened) {
  const TempDir dir("ditops_safetensors");
  expect_open_fails(dir.path(), {"is a directory, not a regular file"});
  const std::string fifo = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_open_fails(fifo, {"is a FIFO, not a regular file"});  // without blocking on it
  expect_open_fails(dir / "missing.safetensors", {"does not exist"});
}

TEST(Safetensors, WriterRefusesBadTensorsAndNonRegularTargets) {
  const TempDir dir("ditops_safetensors");
  const std::string path = dir / "out.safetensors";
  const std::string four(4, '\0');
  const auto expect_write_fails = [&](const std::string& target,
                                      const std::vector<SafetensorsEntry>& tensors,
                                      const std::string& needle) {
    try {
      loader::write_safetensors(target, tensors);
      ADD_FAILURE() << "no Error for " << needle;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(target), std::string::npos) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message;
    }
  };
  expect_write_fails(path, {{"w", "F24", {1}, four}}, "tensor \"w\": unknown dtype \"F24\"");
  expect_write_fails(path, {{"w", "F32", {2}, four}},
                     "tensor \"w\": shape [2] of F32 does not match its 4 bytes");
  expect_write_fails(path, {{"w", "F32", {1}, four}, {"w", "I32", {1}, four}},
                     "tensor \"w\": named twice");
  expect_write_fails(path, {{"__metadata__", "F32", {1}, four}}, "reserved name");
  EXPECT_TRUE(dir.names().empty());

  const std::string sub = dir / "sub";
  std::filesystem::create_directory(sub);
  expect_write_fails(sub, {{"w", "F32", {1}, four}}, "is a directory, not a regular file");
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_write_fails(fifo, {{"w", "F32", {1}, four}}, "is a FIFO, not a regular file");
  const std::string link = dir / "link";
  std::filesystem::create_symlink(sub, link);
  expect_write_fails(link, {{"w", "F32", {1}, four}}, "is a symbolic link");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"fifo", "link", "sub"}));  // all left alone
}

TEST(Safetensors, PublicWriterTakesContiguousViews) {
  const TempDir dir("ditops_safetensors");
  const std::string path = dir / "model.safetensors";
  const std::vector<float> weight = {1.f, -2.f, 0.5f, 4.f, 3.f, -1.f};
  const std::vector<std::int8_t> codes = {-127, 0, 127};
  const std::vector<bf16> halves = {bf16::from_float(1.5f), bf16::from_float(-0.25f)};
  const NamedTensor tensors[] = {{"layer.weight", view(weight.data(), {2, 3})},
                                 {"codes", view(codes.data(), {3})},
                                 {"norm.weight", view(halves.data(), {2})}};
  write_safetensors(path, tensors);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"codes", "layer.weight", "norm.weight"}));
  const auto& written = file.get("layer.weight");
  EXPECT_EQ(written.dtype, "F32");
  EXPECT_EQ(written.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(written.to_floats(path), weight);
  EXPECT_EQ(file.get("codes").dtype, "I8");
  EXPECT_EQ(std::memcmp(file.get("codes").data, codes.data(), codes.size()), 0);
  EXPECT_EQ(file.get("norm.weight").dtype, "BF16");
  EXPECT_EQ(file.get("norm.weight").to_floats(path), (std::vector<float>{1.5f, -0.25f}));

  // Views whose elements are not the file's row-major bytes: the first two columns of `weight`
  // (rows of a larger buffer), and its transpose.
  const auto expect_refused = [&](const TensorView& tensor, const std::string& needle) {
    const NamedTensor named[] = {{"t", tensor}};
    try {
      write_safetensors(dir / "t.safetensors", named);
      ADD_FAILURE() << "no Error for " << needle;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind("write_safetensors: ", 0), 0u) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message;
    }
  };
  expect_refused(view(weight.data(), {2, 2}, {3, 1}),
                 "tensor \"t\" of shape [2, 2] is not contiguous");
  expect_refused(view(weight.data(), {3, 2}, {1, 3}), "t.strides[1] (3) must be 1");
  // The library writer's refusals reach the public one's callers.
  const NamedTensor twice[] = {{"w", view(weight.data(), {6})}, {"w", view(codes.data(), {3})}};
  try {
    write_safetensors(dir / "twice.safetensors", twice);
    ADD_FAILURE() << "no Error for a repeated name";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor \"w\": named twice"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace ditops::test
