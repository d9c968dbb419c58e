#include "base/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace txl {
namespace {

absl::Status PathError(int err, const std::string& path, absl::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

// Closes on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, so that its error (a delayed write error, on some file systems) is seen: 0 or the errno.
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

int OpenRetrying(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  Fd fd(OpenRetrying(path, O_RDONLY));
  if (fd.get() < 0) return PathError(errno, path, "cannot open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return PathError(errno, path, "cannot stat");
  if (S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(path, ": is a directory"));
  std::string out;
  // The size is a hint only (pipes and /proc files report 0): read until end of file.
  out.reserve(S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PathError(errno, path, "cannot read");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  Fd fd(OpenRetrying(path, O_WRONLY | O_CREAT | O_TRUNC, 0666));
  if (fd.get() < 0) return PathError(errno, path, "cannot open for writing");
  while (!contents.empty()) {
    const ssize_t n = ::write(fd.get(), contents.data(), contents.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return PathError(errno, path, "cannot write");
    }
    contents.remove_prefix(static_cast<size_t>(n));
  }
  if (const int err = fd.Close(); err != 0) return PathError(err, path, "cannot write");
  return absl::OkStatus();
}

}  // namespace txl
