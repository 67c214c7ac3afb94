#include "ops/core/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ditops::core {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

FileContents failed(FileStatus status, std::string problem) {
  FileContents contents;
  contents.status = status;
  contents.problem = std::move(problem);
  return contents;
}

FileContents not_regular(mode_t mode) {
  return failed(FileStatus::not_regular,
                std::string("is ") + kind_of(mode) + ", not a regular file");
}

/// Closes the descriptor on every return path.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

FileContents read_regular_file(const std::string& path, std::size_t max_bytes,
                               bool follow_symlink) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. The type is
  // checked on the open descriptor (fstat), so a swap after a stat cannot slip past.
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow_symlink ? 0 : O_NOFOLLOW);
  const Descriptor fd(::open(path.c_str(), flags));
  if (fd.get() < 0) {
    const int error = errno;
    struct stat link;
    if (error == ENOENT) return failed(FileStatus::missing, "does not exist");
    if (error == ELOOP && !follow_symlink && ::lstat(path.c_str(), &link) == 0 &&
        S_ISLNK(link.st_mode)) {
      return not_regular(link.st_mode);
    }
    return failed(FileStatus::unreadable, std::string("cannot be opened: ") + std::strerror(error));
  }
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) {
    return failed(FileStatus::unreadable,
                  std::string("cannot be examined: ") + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) return not_regular(info.st_mode);
  const std::string too_large = "is larger than " + std::to_string(max_bytes) + " bytes";
  if (static_cast<std::size_t>(info.st_size) > max_bytes) {
    return failed(FileStatus::too_large, too_large);
  }
  FileContents contents;
  contents.status = FileStatus::ok;
  contents.mode = info.st_mode & 07777;
  char buffer[1 << 16];
  while (true) {  // to the end, not to st_size: a file may grow while it is read
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return failed(FileStatus::unreadable, std::string("cannot be read: ") + std::strerror(errno));
    }
    if (got == 0) break;
    if (contents.text.size() + static_cast<std::size_t>(got) > max_bytes) {
      return failed(FileStatus::too_large, too_large);
    }
    contents.text.append(buffer, static_cast<std::size_t>(got));
  }
  return contents;
}

}  // namespace ditops::core
