#pragma once
// Reading a file named by a user (an environment variable, a command-line flag) without trusting
// what the name points at: a FIFO would block the read forever, a device (/dev/zero) never ends,
// a directory is no file. Only a regular file of bounded size is read; a caller that later
// replaces the file can also refuse a symbolic link, so it never writes through one.

#include <cstddef>
#include <string>

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

}  // namespace ditops::core
