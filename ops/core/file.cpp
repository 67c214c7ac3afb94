#include "ops/core/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

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

std::string not_regular_problem(mode_t mode) {
  return std::string("is ") + kind_of(mode) + ", not a regular file";
}

}  // namespace

RegularFile RegularFile::open(const std::string& path, bool follow_symlink) {
  RegularFile file;
  const auto fail = [&file](FileStatus status, std::string problem) -> RegularFile {
    if (file.fd_ >= 0) ::close(file.fd_);
    file.fd_ = -1;
    file.status_ = status;
    file.problem_ = std::move(problem);
    return std::move(file);
  };
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. The type is
  // checked on the open descriptor (fstat), so a swap after a stat cannot slip past.
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow_symlink ? 0 : O_NOFOLLOW);
  file.fd_ = ::open(path.c_str(), flags);
  if (file.fd_ < 0) {
    const int error = errno;
    struct stat link;
    if (error == ENOENT) return fail(FileStatus::missing, "does not exist");
    if (error == ELOOP && !follow_symlink && ::lstat(path.c_str(), &link) == 0 &&
        S_ISLNK(link.st_mode)) {
      return fail(FileStatus::not_regular, not_regular_problem(link.st_mode));
    }
    return fail(FileStatus::unreadable, std::string("cannot be opened: ") + std::strerror(error));
  }
  struct stat info;
  if (::fstat(file.fd_, &info) != 0) {
    return fail(FileStatus::unreadable, std::string("cannot be examined: ") + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode))
    return fail(FileStatus::not_regular, not_regular_problem(info.st_mode));
  file.status_ = FileStatus::ok;
  file.size_ = static_cast<std::int64_t>(info.st_size);
  file.mode_ = info.st_mode & 07777;
  return file;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : status_(other.status_),
      problem_(std::move(other.problem_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      mode_(other.mode_) {}

FileContents read_regular_file(const std::string& path, std::size_t max_bytes,
                               bool follow_symlink) {
  const RegularFile file = RegularFile::open(path, follow_symlink);
  if (file.status() != FileStatus::ok) return failed(file.status(), file.problem());
  const std::string too_large = "is larger than " + std::to_string(max_bytes) + " bytes";
  if (static_cast<std::size_t>(file.size()) > max_bytes) {
    return failed(FileStatus::too_large, too_large);
  }
  FileContents contents;
  contents.status = FileStatus::ok;
  contents.mode = file.mode();
  char buffer[1 << 16];
  while (true) {  // to the end, not to st_size: a file may grow while it is read
    const ssize_t got = ::read(file.fd(), buffer, sizeof buffer);
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

std::string replace_file(const std::string& path, const std::vector<std::string_view>& parts,
                         unsigned mode) {
  // rename() would put a regular file where a symbolic link, FIFO or device was (and fail on a
  // directory only after the whole file was written).
  struct stat existing;
  if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    return not_regular_problem(existing.st_mode);
  }
  static std::atomic<unsigned> counter{0};
  std::string temporary;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {  // a stale name from a killed run
    temporary = path + ".tmp." + std::to_string(static_cast<long>(::getpid())) + "." +
                std::to_string(counter.fetch_add(1));
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return "cannot create " + temporary + ": " + std::strerror(errno);
  std::string failure;
  if (mode != 0 && ::fchmod(fd, mode) != 0) failure = std::string("chmod: ") + std::strerror(errno);
  for (const std::string_view part : parts) {
    for (std::size_t done = 0; failure.empty() && done < part.size();) {
      const ssize_t wrote = ::write(fd, part.data() + done, part.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote < 0) failure = std::string("write: ") + std::strerror(errno);
      if (wrote > 0) done += static_cast<std::size_t>(wrote);
    }
  }
  if (failure.empty() && ::fsync(fd) != 0) failure = std::string("fsync: ") + std::strerror(errno);
  if (::close(fd) != 0 && failure.empty()) failure = std::string("close: ") + std::strerror(errno);
  if (failure.empty() && std::rename(temporary.c_str(), path.c_str()) != 0) {
    failure = std::string("rename: ") + std::strerror(errno);
  }
  if (!failure.empty()) ::unlink(temporary.c_str());
  return failure;
}

}  // namespace ditops::core
