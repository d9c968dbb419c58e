// DirectoryStateBackend: each key is a file under the root (key "a/b" is
// ROOT/a/b). Put writes a temp file beside the key and renames it over the
// key, so readers see the old or the new value, never a mix. Files whose
// name starts with "." are the backend's own (".lock", temp files): no valid
// key has such a segment, so they never collide with or show up as keys.
// Write and its grouped appends are in state_backend_dir_write.cc.
#include "server/durability/state_backend_dir_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/durability/state_backend.h"
#include "server/durability/state_backend_impl.h"

namespace txl {
namespace state_backend_internal {
namespace {

constexpr char kTempInfix[] = ".tmp.";

int Fsync(int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// fsync by path (a file or a directory); 0 or the errno.
int FsyncPath(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno;
  return Fsync(fd.get());
}

// SetDirectoryFaultsForTest's hook; read and set under its own mutex.
absl::Mutex fault_mu;
std::function<int(absl::string_view, const std::string&)>* fault_hook ABSL_GUARDED_BY(fault_mu) = nullptr;

bool IsTempName(absl::string_view name) { return absl::StartsWith(name, ".") && absl::StrContains(name, kTempInfix); }

}  // namespace

int WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

int OpenRetryingEintr(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

int Fault(absl::string_view point, const std::string& key) {
  absl::MutexLock lock(&fault_mu);
  return fault_hook == nullptr ? 0 : (*fault_hook)(point, key);
}

DirectoryStateBackend::DirectoryStateBackend(std::string root, FsyncPolicy fsync, absl::Duration interval, int lock_fd,
                                             std::string writer)
    : root_(std::move(root)), writer_(std::move(writer)), fsync_(fsync), interval_(interval), lock_fd_(lock_fd) {
  if (fsync_ == FsyncPolicy::kInterval) syncer_ = std::thread([this] { SyncLoop(); });
}

DirectoryStateBackend::~DirectoryStateBackend() {
  if (syncer_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    syncer_.join();  // it syncs what is still dirty on its way out
  }
  absl::MutexLock lock(&cas_mu_);
  ::close(lock_fd_);
}

absl::Status DirectoryStateBackend::Put(const std::string& key, absl::string_view value) {
  if (!IsValidStateKey(key)) return InvalidKey(key);
  return PutFile(key, value);
}

absl::StatusOr<std::string> DirectoryStateBackend::Get(const std::string& key) {
  if (!IsValidStateKey(key)) return InvalidKey(key);
  const std::string path = PathOf(key);
  Fd fd(OpenRetryingEintr(path, O_RDONLY));
  if (fd.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFound(key);
    return KeyError(errno, key, "open", path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return KeyError(errno, key, "stat", path);
  if (S_ISDIR(st.st_mode)) return NotFound(key);  // "a" when only "a/b" exists
  std::string value;
  value.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return KeyError(errno, key, "read", path);
    }
    if (n == 0) break;
    value.append(buf, static_cast<size_t>(n));
  }
  return value;
}

absl::Status DirectoryStateBackend::Delete(const std::string& key) {
  if (!IsValidStateKey(key)) return InvalidKey(key);
  return DeleteFile(key);
}

absl::StatusOr<std::vector<std::string>> DirectoryStateBackend::List(const std::string& prefix) {
  std::vector<std::string> keys;
  RETURN_IF_ERROR(Walk("", prefix, &keys));
  std::sort(keys.begin(), keys.end());
  return keys;
}

absl::StatusOr<bool> DirectoryStateBackend::CompareAndSet(const std::string& key,
                                                          const std::optional<std::string>& expected,
                                                          absl::string_view value) {
  if (!IsValidStateKey(key)) return InvalidKey(key);
  // flock() excludes other processes, but not other threads sharing this
  // open file description, hence the mutex as well.
  absl::MutexLock lock(&cas_mu_);
  while (::flock(lock_fd_, LOCK_EX) != 0) {
    if (errno != EINTR) return KeyError(errno, key, "flock", absl::StrCat(root_, "/", kLockFile));
  }
  absl::StatusOr<bool> set = CompareAndSetLocked(key, expected, value);
  ::flock(lock_fd_, LOCK_UN);
  return set;
}

absl::Status DirectoryStateBackend::Quarantine(const std::string& key) {
  if (!IsValidStateKey(key)) return InvalidKey(key);
  const std::string path = PathOf(key);
  const std::string stamp = absl::StrCat(absl::ToUnixSeconds(absl::Now()));
  // A second quarantine of the key in the same second gets a suffix
  // rather than replacing the first one's bytes.
  int races = 0;
  for (int n = 0; n < 100; ++n) {
    std::string target = absl::StrCat("quarantine/", key, ".", stamp, n == 0 ? "" : absl::StrCat("-", n));
    if (!IsValidStateKey(target)) return InvalidKey(target);  // only when the key is near the length limit
    const std::string target_path = PathOf(target);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();  // nothing to keep
      return KeyError(errno, key, "stat", path);
    }
    RETURN_IF_ERROR(MakeParents(target));
    int err = RenameNoReplace(path, target_path);
    if (err == EEXIST) continue;
    if (err == ENOENT && ++races < kMaxDirRaces) {
      --n;  // the key went away, or a Delete removed the target's new directory: look again
      continue;
    }
    if (err != 0) return KeyError(err, key, absl::StrCat("rename to ", target_path, " from"), path);
    RETURN_IF_ERROR(SyncDir(Dirname(target_path)));
    RETURN_IF_ERROR(SyncDir(Dirname(path)));
    RemoveEmptyParents(path);
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError(absl::StrCat("state key \"", key, "\": too many quarantined copies this second"));
}

absl::Status DirectoryStateBackend::RemoveStaleTemps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    // Another replica sharing the directory may remove an emptied session directory meanwhile.
    if (dir != root_ && (errno == ENOENT || errno == ENOTDIR)) return absl::OkStatus();
    return absl::ErrnoToStatus(errno, absl::StrCat("state directory: open ", dir));
  }
  absl::Cleanup closer = [d] { ::closedir(d); };
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(dir, "/", name);
    if (IsDirectory(path, e)) {
      RETURN_IF_ERROR(RemoveStaleTemps(path));
    } else if (IsTempName(name) && (IsOwnTemp(name) || IsOldFile(path)) && ::unlink(path.c_str()) != 0 &&
               errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("state directory: remove stale temp file ", path));
    }
  }
  return absl::OkStatus();
}

bool DirectoryStateBackend::IsOwnTemp(const std::string& name) const {
  return !writer_.empty() && absl::StrContains(name, absl::StrCat(kTempInfix, writer_, "."));
}

bool DirectoryStateBackend::IsOldFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && ::time(nullptr) - st.st_mtime > 3600;
}

bool DirectoryStateBackend::IsDirectory(const std::string& path, const struct dirent* e) {
  if (e->d_type != DT_UNKNOWN) return e->d_type == DT_DIR;
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int DirectoryStateBackend::RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  // A file system without RENAME_NOREPLACE: link() refuses to replace too.
  if (::link(from.c_str(), to.c_str()) != 0) return errno;
  return ::unlink(from.c_str()) == 0 || errno == ENOENT ? 0 : errno;
}

absl::StatusOr<bool> DirectoryStateBackend::CompareAndSetLocked(const std::string& key,
                                                                const std::optional<std::string>& expected,
                                                                absl::string_view value) {
  absl::StatusOr<std::string> current = Get(key);
  if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
  const bool matches = expected.has_value() ? current.ok() && *current == *expected : !current.ok();
  if (!matches) return false;
  RETURN_IF_ERROR(PutFile(key, value));
  return true;
}

absl::Status DirectoryStateBackend::DeleteFile(const std::string& key, bool* removed) {
  const std::string path = PathOf(key);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT || errno == ENOTDIR || errno == EISDIR) return absl::OkStatus();
    return KeyError(errno, key, "unlink", path);
  }
  if (removed != nullptr) *removed = true;
  RETURN_IF_ERROR(SyncDir(Dirname(path)));
  RemoveEmptyParents(path);
  return absl::OkStatus();
}

absl::Status DirectoryStateBackend::PutFile(const std::string& key, absl::string_view value, bool* renamed) {
  const std::string path = PathOf(key);
  const std::string dir = Dirname(path);
  const std::string temp =
      absl::StrCat(dir, "/.", path.substr(dir.size() + 1), kTempInfix, writer_, writer_.empty() ? "" : ".", ::getpid(),
                   ".", temp_counter_.fetch_add(1, std::memory_order_relaxed));
  int raw = OpenRetryingEintr(temp, O_WRONLY | O_CREAT | O_EXCL);
  for (int attempt = 0; raw < 0 && errno == ENOENT && attempt < kMaxDirRaces; ++attempt) {
    RETURN_IF_ERROR(MakeParents(key));
    raw = OpenRetryingEintr(temp, O_WRONLY | O_CREAT | O_EXCL);
  }
  if (raw < 0) return KeyError(errno, key, "create", temp);
  Fd fd(raw);
  absl::Cleanup remove_temp = [&temp] { ::unlink(temp.c_str()); };
  if (int err = WriteAll(fd.get(), value); err != 0) return KeyError(err, key, "write", temp);
  if (fsync_ == FsyncPolicy::kAlways) {
    if (int err = Fsync(fd.get()); err != 0) return KeyError(err, key, "fsync", temp);
  }
  if (int err = fd.Close(); err != 0) return KeyError(err, key, "close", temp);
  if (::rename(temp.c_str(), path.c_str()) != 0) return KeyError(errno, key, "rename over", path);
  std::move(remove_temp).Cancel();
  if (renamed != nullptr) *renamed = true;
  if (int err = Fault("rename", key); err != 0) return KeyError(err, key, "sync after renaming over", path);
  if (fsync_ == FsyncPolicy::kInterval) {
    absl::MutexLock lock(&mu_);
    dirty_.insert(path);
  }
  return SyncDir(dir);
}

absl::Status DirectoryStateBackend::MakeParents(const std::string& key) {
  for (size_t slash = key.find('/'); slash != std::string::npos; slash = key.find('/', slash + 1)) {
    const std::string dir = PathOf(key.substr(0, slash));
    if (::mkdir(dir.c_str(), 0755) == 0) {
      // The new entry lives in its parent; the new directory's own entries
      // are synced by whoever adds them.
      RETURN_IF_ERROR(SyncDir(Dirname(dir)));
    } else if (errno != EEXIST) {
      return KeyError(errno, key, "mkdir", dir);
    }
  }
  return absl::OkStatus();
}

absl::Status DirectoryStateBackend::SyncDir(const std::string& dir) {
  if (fsync_ == FsyncPolicy::kAlways) {
    if (int err = FsyncPath(dir); err != 0) {
      return absl::ErrnoToStatus(err, absl::StrCat("state directory: fsync ", dir));
    }
  } else if (fsync_ == FsyncPolicy::kInterval) {
    absl::MutexLock lock(&mu_);
    dirty_.insert(dir);
  }
  return absl::OkStatus();
}

void DirectoryStateBackend::RemoveEmptyParents(const std::string& path) {
  for (std::string dir = Dirname(path); dir.size() > root_.size(); dir = Dirname(dir)) {
    if (::rmdir(dir.c_str()) != 0) return;
    (void)SyncDir(Dirname(dir));  // best effort: an empty directory left after a crash is harmless
  }
}

absl::Status DirectoryStateBackend::Walk(const std::string& rel_dir, const std::string& prefix,
                                         std::vector<std::string>* keys) {
  const std::string dir = rel_dir.empty() ? root_ : PathOf(rel_dir);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();  // removed while we walked
    return absl::ErrnoToStatus(errno, absl::StrCat("state directory: list ", dir));
  }
  absl::Cleanup closer = [d] { ::closedir(d); };
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;  // ".", "..", the lock file, temp files
    const std::string rel = rel_dir.empty() ? name : absl::StrCat(rel_dir, "/", name);
    if (IsDirectory(PathOf(rel), e)) {
      const std::string as_prefix = rel + "/";
      // Only into directories that can hold a match (and quarantine/ only on request).
      if ((absl::StartsWith(prefix, as_prefix) || absl::StartsWith(as_prefix, prefix)) &&
          (rel != "quarantine" || absl::StartsWith(prefix, "quarantine/"))) {
        RETURN_IF_ERROR(Walk(rel, prefix, keys));
      }
    } else if (IsValidStateKey(rel) && ListIncludes(rel, prefix)) {
      keys->push_back(rel);
    }
  }
  return absl::OkStatus();
}

void DirectoryStateBackend::SyncLoop() {
  mu_.Lock();
  while (true) {
    const bool stopping = mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
    std::set<std::string> dirty;
    dirty.swap(dirty_);
    mu_.Unlock();
    for (const std::string& path : dirty) {
      // Gone since (deleted, quarantined, replaced by a rename): nothing to sync.
      if (int err = FsyncPath(path); err != 0 && err != ENOENT) {
        TXL_LOG(ERROR) << "state directory: fsync " << path << ": " << std::strerror(err);
      }
    }
    mu_.Lock();
    if (stopping) break;
  }
  mu_.Unlock();
}

void SetDirectoryFaultsForTest(std::function<int(absl::string_view point, const std::string& key)> fault) {
  absl::MutexLock lock(&fault_mu);
  delete fault_hook;
  fault_hook = fault ? new std::function<int(absl::string_view, const std::string&)>(std::move(fault)) : nullptr;
}

absl::StatusOr<std::unique_ptr<StateBackend>> OpenDirectoryStateBackend(const std::string& root, FsyncPolicy fsync,
                                                                        absl::Duration fsync_interval,
                                                                        const std::string& writer) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(root, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("state directory ", root, ": ", ec.message()));
  std::string dir = abs.lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("state directory ", dir, ": cannot create: ", ec.message()));
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::UnavailableError(absl::StrCat("state directory ", dir, ": not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::UnavailableError(absl::StrCat("state directory ", dir, ": not writable: ", std::strerror(errno)));
  }
  const std::string lock_path = absl::StrCat(dir, "/", kLockFile);
  int lock_fd = OpenRetryingEintr(lock_path, O_RDWR | O_CREAT);
  if (lock_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("state directory ", dir, ": cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  auto backend = std::make_unique<DirectoryStateBackend>(dir, fsync, fsync_interval, lock_fd, writer);
  if (absl::Status s = backend->RemoveStaleTemps(dir); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  return backend;
}

}  // namespace state_backend_internal
}  // namespace txl
