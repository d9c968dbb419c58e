// ModelRepository: the versions of the models under a repository directory
// (DIR/NAME/VERSION/model.pt, base/model_repository_layout.h) that a server
// holds loaded, and each one's state. Poll() rescans and applies the version
// policy; Find() gives a request the version it names (or the newest ready
// one). Transport-free and torch-free: what a loaded version is (its engine,
// its scheduler) is the loader's business, behind ServedVersion.
//
// Promises:
// - A version is ready only once the loader accepted it (the loader runs the
//   checks: the checkpoint's fingerprint, config against tensors, a warm-up
//   step). A half-copied or damaged file is FAILED with the loader's reason,
//   retried when the file changes, and the versions already serving go on.
// - A version the policy no longer wants retires only once a newer wanted
//   version is ready, at once when its directory is removed, or on Unload. A retiring
//   version takes no new requests (Find skips it); whoever still holds it
//   (a session bound to it) keeps it alive, and it is UNLOADED when the last
//   holder lets go; it is then freed by the releaser (SetReleaser), not on
//   the thread that let go.
// - With a memory budget, a version is loaded only when the sizer's estimate
//   fits beside the versions that hold memory (LOADING, READY, and RETIRING
//   ones still held); otherwise it is FAILED with the figures, before any
//   load, and tried again on the next poll.
//
// Threading: thread-safe. mu_ guards the table; loads run outside it (Find
// keeps answering during a slow load); poll_mu_ keeps polls one at a time.
#ifndef TXL_SERVER_ENGINE_MODEL_REPOSITORY_H_
#define TXL_SERVER_ENGINE_MODEL_REPOSITORY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/model_repository_layout.h"
#include "server/engine/version_policy.h"

namespace txl {

// A loaded version, as the server serves it; the repository holds and counts it.
class ServedVersion {
 public:
  virtual ~ServedVersion() = default;
};

enum class VersionState { kLoading, kReady, kFailed, kRetiring, kUnloaded };
const char* VersionStateName(VersionState state);

struct VersionStatus {
  std::string model;
  int64_t version = 0;
  VersionState state = VersionState::kLoading;
  std::string reason;  // FAILED: the loader's error; RETIRING/UNLOADED: why
  std::string path;
};

struct ModelRepositoryConfig {
  std::string dir;
  VersionPolicy policy;
  // Bytes the versions' weights may hold together (--model_memory_budget),
  // as the VersionSizer estimates them; 0: no limit.
  int64_t memory_budget_bytes = 0;
};

// Where a version goes when its last holder lets go, to be freed there
// (RepositoryPoller::Releaser: the poller's thread) rather than on whichever
// thread dropped it, the engine's for a session that expired. It takes the
// version (moving from *version) and returns true, or returns false (it is
// stopping) and the version is freed where it was dropped.
using VersionReleaser = std::function<bool(std::shared_ptr<ServedVersion>* version)>;

// Loads and checks one version; its error becomes the FAILED reason.
using VersionLoader =
    std::function<absl::StatusOr<std::shared_ptr<ServedVersion>>(const std::string& model, const RepositoryVersion& v)>;
// The bytes a version will hold once loaded, from its files alone (before
// loading it); its error becomes the FAILED reason.
using VersionSizer = std::function<absl::StatusOr<int64_t>(const RepositoryVersion& v)>;

class ModelRepository {
 public:
  // Scans once (Poll). NOT_FOUND naming the directory when it is missing.
  // `sizer` may be null when there is no memory budget (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Create(const ModelRepositoryConfig& config,
                                                                 VersionLoader loader, VersionSizer sizer = nullptr);

  // Rescans the directory: loads the wanted versions not yet loaded (and
  // failed ones whose file changed), retires what the policy dropped.
  absl::Status Poll() ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // Explicit control. Unload: every version of `model` stops taking new
  // requests now (RETIRING until its holders let go) and polls leave the
  // model alone until Load; NOT_FOUND for a model never seen. Load: clears
  // that and polls; NOT_FOUND when the directory has no such model,
  // FAILED_PRECONDITION with the reasons when no version of it is ready after.
  absl::Status Unload(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Load(const std::string& model) ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // A version sessions recovered from the state store are bound to, loaded
  // for them even when the policy serves a newer one: READY or still held,
  // as it is; else loaded from its file (outside mu_) as RETIRING, so that
  // it takes no new sessions and is freed when the last of them ends.
  // RESOURCE_EXHAUSTED, with the figures, when it does not fit the memory
  // budget, and for that alone (its sessions then wait: recovery.h);
  // NOT_FOUND when its file is gone; the loader's error when it fails.
  absl::StatusOr<std::shared_ptr<ServedVersion>> Keep(const std::string& model, int64_t version)
      ABSL_LOCKS_EXCLUDED(poll_mu_, mu_);

  // Whether `model` was unloaded (Unload) and not loaded again since.
  bool Unloaded(const std::string& model) const ABSL_LOCKS_EXCLUDED(mu_);

  struct Found {
    int64_t version = 0;
    std::shared_ptr<ServedVersion> served;
  };
  // `version` 0: the newest ready version. NOT_FOUND naming the model (and
  // the version, with its state) when nothing ready matches.
  absl::StatusOr<Found> Find(const std::string& model, int64_t version = 0) const ABSL_LOCKS_EXCLUDED(mu_);

  // Every version seen, by model then version.
  std::vector<VersionStatus> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // The sizer's estimate of what the versions holding memory (LOADING,
  // READY, and RETIRING ones still held) hold together; 0 without a sizer.
  int64_t HeldBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the memory budget (0: none) for the loads from now on; one
  // already over it stays. `note` follows the figure in refusals (where it
  // came from). INVALID_ARGUMENT below 0, or without a sizer.
  absl::Status SetMemoryBudget(int64_t bytes, const std::string& note = "") ABSL_LOCKS_EXCLUDED(mu_);
  // The READY versions' served objects, by model then version.
  std::vector<std::shared_ptr<ServedVersion>> Ready() const ABSL_LOCKS_EXCLUDED(mu_);
  // The READY ones and the RETIRING ones still held, by model then version.
  std::vector<std::shared_ptr<ServedVersion>> Loaded() const ABSL_LOCKS_EXCLUDED(mu_);
  // Where the versions loaded from now on, and those already loaded, are
  // freed once their last holder lets go (unset: where they are dropped). A
  // version let go of stays RETIRING, and in the memory budget, until it is
  // freed; wanted again meanwhile, it serves again without a load.
  void SetReleaser(VersionReleaser releaser);

 private:
  struct Stamp {
    int64_t size = -1, mtime_ns = -1;
    bool operator==(const Stamp& o) const { return size == o.size && mtime_ns == o.mtime_ns; }
  };
  struct Entry {
    VersionState state = VersionState::kLoading;
    std::string reason, path;
    Stamp stamp;                            // of model.pt when last tried
    int64_t bytes = 0;                      // the sizer's estimate, once admitted
    bool over_budget = false;               // FAILED for the budget: tried again on each poll
    std::shared_ptr<ServedVersion> served;  // READY
    std::weak_ptr<ServedVersion> retiring;  // RETIRING: held by others only
    // What the handed-out references wrap: alive until the version is freed
    // (after the last of them goes, it waits with the releaser), and counted
    // as RETIRING until then.
    std::weak_ptr<ServedVersion> owner;
  };
  using Versions = std::map<int64_t, Entry>;
  // The releaser, shared with every version's last reference, which may
  // outlive the repository.
  struct ReleaserSlot {
    absl::Mutex mu;
    VersionReleaser releaser ABSL_GUARDED_BY(mu);
  };

  ModelRepository(const ModelRepositoryConfig& config, VersionLoader loader, VersionSizer sizer)
      : config_(config), loader_(std::move(loader)), sizer_(std::move(sizer)), budget_(config.memory_budget_bytes) {}
  static Stamp StampOf(const std::string& path);
  // Versions let go of under a lock, freed once it is released.
  using Dropped = std::vector<std::shared_ptr<ServedVersion>>;
  // Retires `e` (READY) for `why`; its reference goes to `dropped`.
  static void Retire(Entry& e, const std::string& why, Dropped* dropped);
  static VersionState StateOf(const Entry& e);
  // What the repository hands out for a loaded version: when the last copy
  // goes, `owner` goes to the releaser.
  std::shared_ptr<ServedVersion> Released(std::shared_ptr<ServedVersion> owner) const;
  // A RETIRING version's reference: a holder's, or a new one while it waits
  // to be freed; null once freed.
  std::shared_ptr<ServedVersion> Held(Entry& e) const;
  // Loads one version the poll chose (budget, loader), outside mu_.
  void LoadOne(const std::string& model, const RepositoryVersion& v) ABSL_LOCKS_EXCLUDED(mu_);
  // Why (model, version) needing `need` bytes does not fit the budget beside
  // the versions holding memory (the figures), or empty when it fits.
  std::string OverBudget(const std::string& model, int64_t version, int64_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes held by the versions other than (model, version), and who holds them.
  int64_t BytesInUse(const std::string& model, int64_t version, std::string* holders) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ModelRepositoryConfig config_;
  const VersionLoader loader_;
  const VersionSizer sizer_;
  absl::Mutex poll_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Versions> models_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> unloaded_ ABSL_GUARDED_BY(mu_);  // by Unload, until Load
  int64_t budget_ ABSL_GUARDED_BY(mu_);                  // bytes; 0: none (config_'s, or SetMemoryBudget's)
  std::string budget_note_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<ReleaserSlot> releaser_ = std::make_shared<ReleaserSlot>();
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_MODEL_REPOSITORY_H_
