#pragma once
// Reading a file named by a user (an environment variable, a command-line flag) without trusting
// what the name points at: a FIFO would block the read forever, a device (/dev/zero) never ends,
// a directory is no file. Only a regular file of bounded size is read; a caller that later
// replaces the file can also refuse a symbolic link, so it never writes through one.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ditops::core {

/// The limit for input files the tools read (hardware descriptions, benchmark results): far
/// above any real one, far below what would exhaust memory.
inline constexpr std::size_t kMaxInputFileBytes = std::size_t{64} << 20;

enum class FileStatus {
  ok,           ///< a regular file, read whole
  missing,      ///< no such file (a cache not written yet)
  not_regular,  ///< a FIFO, device, directory, socket, or (not following) a symbolic link
  too_large,    ///< more than the caller's limit
  unreadable,   ///< any other error (permissions, I/O)
};

struct FileContents {
  FileStatus status = FileStatus::missing;
  std::string text;     ///< the file, when status is ok
  std::string problem;  ///< what is wrong, for a message naming the file ("is a FIFO, ...")
  unsigned mode = 0;    ///< permission bits of a regular file (to keep them when replacing it)
};

/// Reads `path` if it is a regular file of at most `max_bytes`, never blocking on what it names.
/// With follow_symlink false a symbolic link itself is refused (not_regular).
FileContents read_regular_file(const std::string& path, std::size_t max_bytes, bool follow_symlink);

/// A descriptor open for reading on what `path` names, with read_regular_file's checks but no
/// read: for a reader that maps a file too large to copy (model weights). Closed with the object.
class RegularFile {
 public:
  /// status ok: a regular file, open; otherwise fd() is -1 and problem() says why.
  static RegularFile open(const std::string& path, bool follow_symlink);
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  FileStatus status() const noexcept { return status_; }
  const std::string& problem() const noexcept { return problem_; }
  int fd() const noexcept { return fd_; }
  std::int64_t size() const noexcept { return size_; }  ///< bytes when opened
  unsigned mode() const noexcept { return mode_; }      ///< permission bits

 private:
  RegularFile() = default;
  FileStatus status_ = FileStatus::missing;
  std::string problem_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  unsigned mode_ = 0;
};

/// Writes `parts`, one after the other, to a new file beside `path`, fsyncs it and renames it
/// over `path`: readers, and a process killed mid-write, see the old file or the new one, never a
/// part. `mode` 0 leaves the new file's permissions to the umask. Anything at `path` that is not a
/// regular file (a directory, a FIFO, a symbolic link) is left alone and reported. Returns what
/// failed, or "".
std::string replace_file(const std::string& path, const std::vector<std::string_view>& parts,
                         unsigned mode);

}  // namespace ditops::core
