// Private to the directory backend (state_backend_dir*.cc): the
// DirectoryStateBackend class, and the file helpers its parts share. The
// guarded writes (Write, and the grouped appends under it) are in
// state_backend_dir_write.cc, the rest in state_backend_dir.cc.
#ifndef TXL_SERVER_DURABILITY_STATE_BACKEND_DIR_INTERNAL_H_
#define TXL_SERVER_DURABILITY_STATE_BACKEND_DIR_INTERNAL_H_

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/durability/state_backend.h"

namespace txl {
namespace state_backend_internal {

inline constexpr char kLockFile[] = ".lock";
// Bounds the retries when a concurrent Delete removes a directory (now
// empty) that a Put or Append just created for its key.
inline constexpr int kMaxDirRaces = 8;

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

inline std::string Dirname(const std::string& path) { return path.substr(0, path.rfind('/')); }

inline absl::Status KeyError(int err, const std::string& key, absl::string_view op, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat("state key \"", key, "\": ", op, " ", path));
}

// A failure that left nothing in place. Some errnos (EIO) map to UNKNOWN,
// which Write keeps for outcomes that are unknown.
inline absl::Status Definite(absl::Status s) { return absl::IsUnknown(s) ? absl::UnavailableError(s.message()) : s; }

inline absl::Status InvalidKey(const std::string& key) {
  return absl::InvalidArgumentError(absl::StrCat("invalid state key \"", key, "\""));
}

// Loops over short writes; 0 or the errno.
int WriteAll(int fd, absl::string_view data);

int OpenRetryingEintr(const std::string& path, int flags, mode_t mode = 0644);

// The errno a test injects at `point` for `key`, or 0.
int Fault(absl::string_view point, const std::string& key);

class DirectoryStateBackend : public StateBackend {
 public:
  DirectoryStateBackend(std::string root, FsyncPolicy fsync, absl::Duration interval, int lock_fd, std::string writer);
  ~DirectoryStateBackend() override;

  std::string Describe() const override { return absl::StrCat("dir:", root_); }
  absl::Status Put(const std::string& key, absl::string_view value) override;
  bool AppliesLate() const override { return false; }
  absl::Status Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::Status Delete(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override;
  absl::StatusOr<bool> CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                     absl::string_view value) override;
  absl::Status Quarantine(const std::string& key) override;

  // Removes temp files a crash of this writer left behind (a Put that never
  // renamed), and anyone's older than an hour; a shared directory's other
  // writers may have theirs in flight.
  absl::Status RemoveStaleTemps(const std::string& dir);

 private:
  std::string PathOf(const std::string& key) const { return absl::StrCat(root_, "/", key); }

  static absl::Status NotFound(const std::string& key) {
    return absl::NotFoundError(absl::StrCat("state key \"", key, "\" not found"));
  }

  bool IsOwnTemp(const std::string& name) const;
  static bool IsOldFile(const std::string& path);
  static bool IsDirectory(const std::string& path, const struct dirent* e);
  static int RenameNoReplace(const std::string& from, const std::string& to);

  absl::StatusOr<bool> CompareAndSetLocked(const std::string& key, const std::optional<std::string>& expected,
                                           absl::string_view value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cas_mu_);

  // --- The guarded writes (state_backend_dir_write.cc). ---
  // Appends the group (keys already valid). All or nothing: on a failure
  // every file is cut back to its length before the group; *clean says
  // whether that worked (else some bytes of the group may remain).
  absl::Status AppendGroup(const std::vector<std::pair<std::string, std::string>>& appends, bool* clean);
  // Write's body, under the store's lock. Runs of writes that only append
  // go to disk as one group (AppendGroup: one open and one sync per file),
  // their guards checked against the lengths the run's earlier appends will
  // give. A failure decides the writes it happens in (not applied, or
  // unknown once something of them took effect); later ones are not tried.
  absl::Status WriteLocked(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cas_mu_);
  // kWriteApplied when every guard holds, else the first failing one's
  // index. `pending`: bytes not yet appended to a key, counted in its length.
  absl::StatusOr<int> CheckGuards(const std::vector<StoreGuard>& guards, const std::map<std::string, int64_t>& pending);
  // The key's length in bytes (0 when absent), without reading it.
  absl::StatusOr<int64_t> Length(const std::string& key);
  // One mutation; *took: whether it took effect (also when the call fails).
  absl::Status Mutate(const StoreMutation& m, bool* took);

  // *removed: whether the file is gone (also when the sync after it fails).
  absl::Status DeleteFile(const std::string& key, bool* removed = nullptr);
  // *renamed: whether the new value is in place (also when a later sync fails).
  absl::Status PutFile(const std::string& key, absl::string_view value, bool* renamed = nullptr);
  // mkdir -p for the key's parent directories.
  absl::Status MakeParents(const std::string& key);
  // After a change to the directory's entries: synced now under kAlways,
  // by the syncer under kInterval.
  absl::Status SyncDir(const std::string& dir);
  // Deleted sessions would otherwise leave their directories behind. rmdir
  // removes only empty ones; a Put racing into one retries its MakeParents.
  void RemoveEmptyParents(const std::string& path);
  // Appends the keys under ROOT/rel_dir that List(prefix) reports.
  absl::Status Walk(const std::string& rel_dir, const std::string& prefix, std::vector<std::string>* keys);
  void SyncLoop() ABSL_LOCKS_EXCLUDED(mu_);

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

}  // namespace state_backend_internal
}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_STATE_BACKEND_DIR_INTERNAL_H_
