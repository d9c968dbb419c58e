// DirectoryStateBackend: each key is a file under the root (key "a/b" is
// ROOT/a/b). Put writes a temp file beside the key and renames it over the
// key, so readers see the old or the new value, never a mix. Files whose
// name starts with "." are the backend's own (".lock", temp files): no valid
// key has such a segment, so they never collide with or show up as keys.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

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
constexpr char kLockFile[] = ".lock";
// Bounds the retries when a concurrent Delete removes a directory (now
// empty) that a Put or Append just created for its key.
constexpr int kMaxDirRaces = 8;

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    Reset(other.Release());
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // close(2)'s result: on NFS and the like a failed write shows up only here.
  int Close() {
    int rc = ::close(Release());
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

std::string Dirname(const std::string& path) { return path.substr(0, path.rfind('/')); }

absl::Status KeyError(int err, const std::string& key, absl::string_view op, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat("state key \"", key, "\": ", op, " ", path));
}

// A failure that left nothing in place. Some errnos (EIO) map to UNKNOWN,
// which Write keeps for outcomes that are unknown.
absl::Status Definite(absl::Status s) { return absl::IsUnknown(s) ? absl::UnavailableError(s.message()) : s; }

absl::Status InvalidKey(const std::string& key) {
  return absl::InvalidArgumentError(absl::StrCat("invalid state key \"", key, "\""));
}

// Loops over short writes; 0 or the errno.
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

int Fsync(int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// For appends: the data and the new size, without the timestamps fsync also
// writes (measurably cheaper per engine step under --fsync=always).
int Fdatasync(int fd) {
  while (::fdatasync(fd) != 0) {
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

int OpenRetryingEintr(const std::string& path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// SetDirectoryFaultsForTest's hook; read and set under its own mutex.
absl::Mutex fault_mu;
std::function<int(absl::string_view, const std::string&)>* fault_hook ABSL_GUARDED_BY(fault_mu) = nullptr;

// The errno a test injects at `point` for `key`, or 0.
int Fault(absl::string_view point, const std::string& key) {
  absl::MutexLock lock(&fault_mu);
  return fault_hook == nullptr ? 0 : (*fault_hook)(point, key);
}

bool IsTempName(absl::string_view name) { return absl::StartsWith(name, ".") && absl::StrContains(name, kTempInfix); }

class DirectoryStateBackend : public StateBackend {
 public:
  DirectoryStateBackend(std::string root, FsyncPolicy fsync, absl::Duration interval, int lock_fd, std::string writer)
      : root_(std::move(root)), writer_(std::move(writer)), fsync_(fsync), interval_(interval), lock_fd_(lock_fd) {
    if (fsync_ == FsyncPolicy::kInterval) syncer_ = std::thread([this] { SyncLoop(); });
  }

  ~DirectoryStateBackend() override {
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

  std::string Describe() const override { return absl::StrCat("dir:", root_); }

  absl::Status Put(const std::string& key, absl::string_view value) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    return PutFile(key, value);
  }

  bool AppliesLate() const override { return false; }

  absl::Status Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) override {
    outcomes->assign(writes.size(), kWriteNotApplied);
    for (const StoreWrite& w : writes) {
      for (const StoreGuard& g : w.guards) {
        if (!IsValidStateKey(g.key)) return InvalidKey(g.key);
      }
      for (const StoreMutation& m : w.mutations) {
        if (!IsValidStateKey(m.key)) return InvalidKey(m.key);
      }
    }
    // Under the store's lock, like CompareAndSet: every replica sharing the
    // directory checks and writes one write at a time.
    absl::MutexLock lock(&cas_mu_);
    while (::flock(lock_fd_, LOCK_EX) != 0) {
      if (errno != EINTR) return Definite(KeyError(errno, ".lock", "flock", absl::StrCat(root_, "/", kLockFile)));
    }
    absl::Status s = WriteLocked(writes, outcomes);
    ::flock(lock_fd_, LOCK_UN);
    return s;
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
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

  absl::Status Delete(const std::string& key) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    return DeleteFile(key);
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override {
    std::vector<std::string> keys;
    RETURN_IF_ERROR(Walk("", prefix, &keys));
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  absl::StatusOr<bool> CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                     absl::string_view value) override {
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

  absl::Status Quarantine(const std::string& key) override {
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

  // Removes temp files a crash of this writer left behind (a Put that never
  // renamed), and anyone's older than an hour; a shared directory's other
  // writers may have theirs in flight.
  absl::Status RemoveStaleTemps(const std::string& dir) {
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

 private:
  std::string PathOf(const std::string& key) const { return absl::StrCat(root_, "/", key); }

  static absl::Status NotFound(const std::string& key) {
    return absl::NotFoundError(absl::StrCat("state key \"", key, "\" not found"));
  }

  bool IsOwnTemp(const std::string& name) const {
    return !writer_.empty() && absl::StrContains(name, absl::StrCat(kTempInfix, writer_, "."));
  }
  static bool IsOldFile(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && ::time(nullptr) - st.st_mtime > 3600;
  }

  static bool IsDirectory(const std::string& path, const struct dirent* e) {
    if (e->d_type != DT_UNKNOWN) return e->d_type == DT_DIR;
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  static int RenameNoReplace(const std::string& from, const std::string& to) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return errno;
    // A file system without RENAME_NOREPLACE: link() refuses to replace too.
    if (::link(from.c_str(), to.c_str()) != 0) return errno;
    return ::unlink(from.c_str()) == 0 || errno == ENOENT ? 0 : errno;
  }

  absl::StatusOr<bool> CompareAndSetLocked(const std::string& key, const std::optional<std::string>& expected,
                                           absl::string_view value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cas_mu_) {
    absl::StatusOr<std::string> current = Get(key);
    if (!current.ok() && !absl::IsNotFound(current.status())) return current.status();
    const bool matches = expected.has_value() ? current.ok() && *current == *expected : !current.ok();
    if (!matches) return false;
    RETURN_IF_ERROR(PutFile(key, value));
    return true;
  }

  // Appends the group (keys already valid). All or nothing: on a failure
  // every file is cut back to its length before the group; *clean says
  // whether that worked (else some bytes of the group may remain).
  absl::Status AppendGroup(const std::vector<std::pair<std::string, std::string>>& appends, bool* clean) {
    // One descriptor per key for the whole group; synced once at the end.
    // All or nothing: on any failure every file is cut back to its length
    // before the group, so no session keeps part of a refused write (the
    // journal's durable positions rely on it).
    std::map<std::string, Fd> files;
    std::map<std::string, off_t> before;  // each file's length before the group
    std::set<std::string> created_in;     // directories that got a new entry
    absl::Status status = [&]() -> absl::Status {
      for (const auto& [key, value] : appends) {
        const std::string path = PathOf(key);
        auto it = files.find(path);
        if (it == files.end()) {
          int fd = OpenRetryingEintr(path, O_WRONLY | O_APPEND);
          if (fd < 0 && errno == ENOENT) {
            for (int attempt = 0; fd < 0 && errno == ENOENT && attempt < kMaxDirRaces; ++attempt) {
              RETURN_IF_ERROR(MakeParents(key));
              fd = OpenRetryingEintr(path, O_WRONLY | O_APPEND | O_CREAT);
            }
            if (fd >= 0) created_in.insert(Dirname(path));
          }
          if (fd < 0) return KeyError(errno, key, "open", path);
          struct stat st;
          if (::fstat(fd, &st) != 0) {
            const int err = errno;
            ::close(fd);
            return KeyError(err, key, "stat", path);
          }
          before[path] = st.st_size;
          it = files.emplace(path, Fd(fd)).first;
        }
        if (int err = WriteAll(it->second.get(), value); err != 0) return KeyError(err, key, "append to", path);
        if (int err = Fault("append", key); err != 0) return KeyError(err, key, "append to", path);
      }
      for (auto& [path, fd] : files) {
        if (fsync_ == FsyncPolicy::kAlways) {
          if (int err = Fdatasync(fd.get()); err != 0) {
            return KeyError(err, path.substr(root_.size() + 1), "fdatasync", path);
          }
        }
      }
      return absl::OkStatus();
    }();
    if (!status.ok()) {
      for (auto& [path, fd] : files) {
        const std::string key = path.substr(root_.size() + 1);
        if (Fault("truncate", key) != 0 || ::ftruncate(fd.get(), before[path]) != 0) *clean = false;
      }
      return status;
    }
    *clean = false;  // the bytes are in place from here on
    for (auto& [path, fd] : files) {
      if (int err = fd.Close(); err != 0) return KeyError(err, path.substr(root_.size() + 1), "close", path);
    }
    for (const std::string& dir : created_in) {
      RETURN_IF_ERROR(SyncDir(dir));
    }
    if (fsync_ == FsyncPolicy::kInterval) {
      absl::MutexLock lock(&mu_);
      for (const auto& [path, fd] : files) dirty_.insert(path);
    }
    return absl::OkStatus();
  }

  // Write's body, under the store's lock. Runs of writes that only append
  // go to disk as one group (AppendGroup: one open and one sync per file),
  // their guards checked against the lengths the run's earlier appends will
  // give. A failure decides the writes it happens in (not applied, or
  // unknown once something of them took effect); later ones are not tried.
  absl::Status WriteLocked(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cas_mu_) {
    std::vector<size_t> run;                                   // the writes of the run of appends
    std::vector<std::pair<std::string, std::string>> appends;  // their mutations
    std::map<std::string, int64_t> pending;                    // bytes the run adds, per key
    auto flush = [&]() -> absl::Status {
      if (run.empty()) return absl::OkStatus();
      bool clean = true;
      absl::Status s = AppendGroup(appends, &clean);
      for (size_t i : run) (*outcomes)[i] = s.ok() ? kWriteApplied : clean ? kWriteNotApplied : kWriteUnknown;
      run.clear();
      appends.clear();
      pending.clear();
      if (s.ok()) return s;
      return clean ? Definite(s)
                   : absl::UnknownError(absl::StrCat(s.message(), " (appends may be in place until read back)"));
    };
    for (size_t i = 0; i < writes.size(); ++i) {
      const StoreWrite& w = writes[i];
      const bool appends_only = std::all_of(w.mutations.begin(), w.mutations.end(),
                                            [](const StoreMutation& m) { return m.kind == StoreMutation::kAppend; });
      // A guard on a value the run changes, other than its length, sees it after the run.
      for (const StoreGuard& g : w.guards) {
        if (g.kind != StoreGuard::kLength && pending.count(g.key)) RETURN_IF_ERROR(flush());
      }
      if (!appends_only) RETURN_IF_ERROR(flush());
      absl::StatusOr<int> failed = CheckGuards(w.guards, pending);
      if (!failed.ok()) {
        absl::Status s = flush();
        return s.ok() ? Definite(failed.status()) : s;
      }
      (*outcomes)[i] = *failed;
      if (*failed != kWriteApplied) continue;
      if (appends_only) {
        run.push_back(i);
        for (const StoreMutation& m : w.mutations) {
          appends.emplace_back(m.key, m.value);
          pending[m.key] += static_cast<int64_t>(m.value.size());
        }
        continue;
      }
      bool changed = false;
      for (const StoreMutation& m : w.mutations) {
        bool took = false;
        absl::Status s = Mutate(m, &took);
        changed = changed || took;
        if (s.ok()) continue;
        if (!changed) {
          (*outcomes)[i] = kWriteNotApplied;
          return Definite(s);
        }
        (*outcomes)[i] = kWriteUnknown;
        return absl::UnknownError(
            absl::StrCat(s.message(), " (", w.label, ": part of the write may be in place until read back)"));
      }
    }
    return flush();
  }

  // kWriteApplied when every guard holds, else the first failing one's
  // index. `pending`: bytes not yet appended to a key, counted in its length.
  absl::StatusOr<int> CheckGuards(const std::vector<StoreGuard>& guards,
                                  const std::map<std::string, int64_t>& pending) {
    for (size_t i = 0; i < guards.size(); ++i) {
      const StoreGuard& g = guards[i];
      bool holds = false;
      if (g.kind == StoreGuard::kLength) {
        ASSIGN_OR_RETURN(int64_t length, Length(g.key));
        auto more = pending.find(g.key);
        holds = length + (more == pending.end() ? 0 : more->second) == g.length;
      } else {
        absl::StatusOr<std::string> value = Get(g.key);
        if (!value.ok() && !absl::IsNotFound(value.status())) return value.status();
        if (g.kind == StoreGuard::kAbsent) {
          holds = !value.ok();
        } else {
          holds = value.ok() && std::find(g.values.begin(), g.values.end(), *value) != g.values.end();
        }
      }
      if (!holds) return static_cast<int>(i);
    }
    return kWriteApplied;
  }

  // The key's length in bytes (0 when absent), without reading it.
  absl::StatusOr<int64_t> Length(const std::string& key) {
    const std::string path = PathOf(key);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return 0;
      return KeyError(errno, key, "stat", path);
    }
    return S_ISDIR(st.st_mode) ? 0 : static_cast<int64_t>(st.st_size);
  }

  // One mutation; *took: whether it took effect (also when the call fails).
  absl::Status Mutate(const StoreMutation& m, bool* took) {
    if (m.kind == StoreMutation::kPut) return PutFile(m.key, m.value, took);
    if (m.kind == StoreMutation::kAppend) {
      bool clean = true;
      absl::Status s = AppendGroup({{m.key, m.value}}, &clean);
      *took = s.ok() || !clean;
      return s;
    }
    return DeleteFile(m.key, took);
  }

  // *removed: whether the file is gone (also when the sync after it fails).
  absl::Status DeleteFile(const std::string& key, bool* removed = nullptr) {
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

  // *renamed: whether the new value is in place (also when a later sync fails).
  absl::Status PutFile(const std::string& key, absl::string_view value, bool* renamed = nullptr) {
    const std::string path = PathOf(key);
    const std::string dir = Dirname(path);
    const std::string temp =
        absl::StrCat(dir, "/.", path.substr(dir.size() + 1), kTempInfix, writer_, writer_.empty() ? "" : ".",
                     ::getpid(), ".", temp_counter_.fetch_add(1, std::memory_order_relaxed));
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

  // mkdir -p for the key's parent directories.
  absl::Status MakeParents(const std::string& key) {
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

  // After a change to the directory's entries: synced now under kAlways,
  // by the syncer under kInterval.
  absl::Status SyncDir(const std::string& dir) {
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

  // Deleted sessions would otherwise leave their directories behind. rmdir
  // removes only empty ones; a Put racing into one retries its MakeParents.
  void RemoveEmptyParents(const std::string& path) {
    for (std::string dir = Dirname(path); dir.size() > root_.size(); dir = Dirname(dir)) {
      if (::rmdir(dir.c_str()) != 0) return;
      (void)SyncDir(Dirname(dir));  // best effort: an empty directory left after a crash is harmless
    }
  }

  // Appends the keys under ROOT/rel_dir that List(prefix) reports.
  absl::Status Walk(const std::string& rel_dir, const std::string& prefix, std::vector<std::string>* keys) {
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

  void SyncLoop() ABSL_LOCKS_EXCLUDED(mu_) {
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

  const std::string root_;
  const std::string writer_;  // in temp file names
  const FsyncPolicy fsync_;
  const absl::Duration interval_;
  std::atomic<uint64_t> temp_counter_{0};

  // Serialises this process's CompareAndSets; the flock on lock_fd_
  // serialises them across processes.
  absl::Mutex cas_mu_;
  int lock_fd_ ABSL_GUARDED_BY(cas_mu_);

  absl::Mutex mu_;
  // Files and directories written since the syncer last ran (kInterval).
  std::set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread syncer_;
};

}  // namespace

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
