// DirectoryStateBackend::Write: guarded writes, each checked and applied
// under the store's lock, where runs of writes that only append go to disk
// as one group (AppendGroup: all or nothing, one open and one sync per file).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "server/durability/state_backend.h"
#include "server/durability/state_backend_dir_internal.h"

namespace txl {
namespace state_backend_internal {
namespace {

// For appends: the data and the new size, without the timestamps fsync also
// writes (measurably cheaper per engine step under --fsync=always).
int Fdatasync(int fd) {
  while (::fdatasync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

}  // namespace

absl::Status DirectoryStateBackend::Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) {
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

absl::Status DirectoryStateBackend::WriteLocked(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) {
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

absl::StatusOr<int> DirectoryStateBackend::CheckGuards(const std::vector<StoreGuard>& guards,
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

absl::StatusOr<int64_t> DirectoryStateBackend::Length(const std::string& key) {
  const std::string path = PathOf(key);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return KeyError(errno, key, "stat", path);
  }
  return S_ISDIR(st.st_mode) ? 0 : static_cast<int64_t>(st.st_size);
}

absl::Status DirectoryStateBackend::Mutate(const StoreMutation& m, bool* took) {
  if (m.kind == StoreMutation::kPut) return PutFile(m.key, m.value, took);
  if (m.kind == StoreMutation::kAppend) {
    bool clean = true;
    absl::Status s = AppendGroup({{m.key, m.value}}, &clean);
    *took = s.ok() || !clean;
    return s;
  }
  return DeleteFile(m.key, took);
}

absl::Status DirectoryStateBackend::AppendGroup(const std::vector<std::pair<std::string, std::string>>& appends,
                                                bool* clean) {
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

}  // namespace state_backend_internal
}  // namespace txl
