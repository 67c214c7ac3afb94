#pragma once
// Safetensors files (the format msmodelslim, PyTorch and Hugging Face write weights in): an
// 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// and then the tensors' bytes, offsets relative to the end of the header.
//
// The reader maps the file (read-only, private) and validates the whole header before it hands
// out anything: every tensor's bytes lie inside the file, match its dtype and shape, and overlap
// no other tensor's. Every error is a ditops::Error naming the file, the tensor and the field.
// The writer lays tensors out so every one is aligned to its element size in a page-aligned
// mapping (the header is padded to 8 bytes, the widest elements come first), and replaces its
// target atomically.

#include <cstddef>
#include <cstdint>
#include <ditops/quant_model.hpp>
#include <ditops/tensor.hpp>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ditops::loader {

/// The largest header the reader accepts (the limit of the reference implementation): a header
/// names tensors, it never holds their data.
inline constexpr std::int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// Bytes per element of a dtype as safetensors spells it ("F32", "I8", "BF16", ...), or 0 for a
/// name the format does not define.
std::int64_t safetensors_dtype_size(std::string_view dtype) noexcept;
/// The safetensors spelling of a ditops dtype ("F32", "I8", ...).
const char* safetensors_dtype_name(DType dtype) noexcept;

/// One tensor of a mapped file: its bytes stay valid while the SafetensorsFile (or a copy of it)
/// lives.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  ///< as the file spells it: "F32", "I64", ...
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  ///< null for a tensor of no bytes
  std::int64_t bytes = 0;

  std::int64_t numel() const noexcept;
  /// "[2, 3]"
  std::string shape_string() const;
  /// A contiguous read-only TensorView of the bytes, for the dtypes ditops has (I8, U8, I32, F32,
  /// F16, BF16, BOOL) and ranks up to kMaxRank; Error naming the file and tensor otherwise. The
  /// data may be misaligned for its dtype (files other writers laid out): check before reading
  /// it as wider than a byte.
  TensorView view(const std::string& file) const;
  /// Element `index` of an F32, F16 or BF16 tensor as float (read byte-wise: any alignment).
  float float_at(std::int64_t index) const noexcept;
  /// All elements of an F32, F16 or BF16 tensor as floats (size checked before allocating);
  /// Error naming the file and tensor for any other dtype.
  std::vector<float> to_floats(const std::string& file) const;
};

/// A validated, memory-mapped safetensors file. Cheap to copy: copies share the mapping, which
/// is unmapped when the last one goes.
class SafetensorsFile {
 public:
  /// Maps and validates `path`, a regular file (FIFOs, devices and directories are refused
  /// without being opened for a blocking read).
  static SafetensorsFile open(const std::string& path);
  /// Tensors another owner holds in memory (a torch model's state dict), under the same checks
  /// as a file's: every dtype is one the format defines, every byte count matches its shape,
  /// no name repeats. `label` stands for the path in messages. The bytes must outlive the
  /// result and its copies.
  static SafetensorsFile of_memory(std::string label, std::vector<SafetensorsTensor> tensors);

  const std::string& path() const noexcept;
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  /// The names that start with `prefix`, sorted.
  std::vector<std::string> names_with_prefix(std::string_view prefix) const;
  /// The tensor, or null.
  const SafetensorsTensor* find(std::string_view name) const noexcept;
  /// The tensor; Error naming the file and the tensor if it has none of that name.
  const SafetensorsTensor& get(std::string_view name) const;
  /// The header's "__metadata__" (empty if it has none).
  const std::map<std::string, std::string>& metadata() const noexcept;

  struct State;

 private:
  explicit SafetensorsFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

/// A tensor to write: `bytes` must hold exactly shape-product × element-size bytes of `dtype`.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  ///< safetensors spelling
  std::vector<std::int64_t> shape;
  std::string_view bytes;
};

/// Writes a safetensors file holding `tensors` and `metadata` to `path`, through a temporary file
/// in the same directory, fsynced and renamed over the target: a reader never sees a part. Error
/// (naming the file and the tensor) for an unknown dtype, a byte count that does not match the
/// shape, a repeated or reserved name, an existing `path` that is not a regular file (it is left
/// alone), or a failed write.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// A named view as a tensor of the format (its bytes the view's): Error naming `call`, `where`
/// and the tensor for a malformed view or one that is not contiguous row-major.
SafetensorsTensor tensor_of_view(const char* call, const std::string& where,
                                 const NamedTensor& named);

}  // namespace ditops::loader
