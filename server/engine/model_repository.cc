#include "server/engine/model_repository.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace txl {

namespace {

bool Contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

const RepositoryVersion* FindVersion(const std::vector<RepositoryVersion>& versions, int64_t v) {
  for (const RepositoryVersion& rv : versions) {
    if (rv.version == v && rv.complete) return &rv;
  }
  return nullptr;
}

}  // namespace

const char* VersionStateName(VersionState state) {
  switch (state) {
    case VersionState::kLoading: return "LOADING";
    case VersionState::kReady: return "READY";
    case VersionState::kFailed: return "FAILED";
    case VersionState::kRetiring: return "RETIRING";
    case VersionState::kUnloaded: return "UNLOADED";
  }
  return "UNKNOWN";
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Create(const ModelRepositoryConfig& config,
                                                                         VersionLoader loader, VersionSizer sizer) {
  if (config.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_memory_budget: must be >= 0 (0: no limit), got ", config.memory_budget_bytes));
  }
  if (config.memory_budget_bytes > 0 && sizer == nullptr) {
    return absl::InvalidArgumentError("a model memory budget needs a sizer");
  }
  std::unique_ptr<ModelRepository> r(new ModelRepository(config, std::move(loader), std::move(sizer)));
  if (absl::Status s = r->Poll(); !s.ok()) return s;
  return r;
}

absl::Status ModelRepository::SetMemoryBudget(int64_t bytes, const std::string& note) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("a model memory budget must be >= 0, got ", bytes));
  if (bytes > 0 && sizer_ == nullptr) return absl::InvalidArgumentError("a model memory budget needs a sizer");
  absl::MutexLock l(&mu_);
  budget_ = bytes;
  budget_note_ = note;
  return absl::OkStatus();
}

int64_t ModelRepository::HeldBytes() const {
  absl::MutexLock l(&mu_);
  std::string holders;
  return BytesInUse("", 0, &holders);
}

ModelRepository::Stamp ModelRepository::StampOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void ModelRepository::Retire(Entry& e, const std::string& why, Dropped* dropped) {
  e.retiring = e.served;
  dropped->push_back(std::move(e.served));
  e.served.reset();
  e.state = VersionState::kRetiring;
  e.reason = why;
}

VersionState ModelRepository::StateOf(const Entry& e) {
  return e.state == VersionState::kRetiring && e.retiring.expired() && e.owner.expired() ? VersionState::kUnloaded
                                                                                         : e.state;
}

absl::Status ModelRepository::Poll() {
  Dropped dropped;  // released after the locks: the last reference frees a version's weights
  absl::MutexLock poll(&poll_mu_);
  auto scan = ScanRepository(config_.dir);
  if (!scan.ok()) return scan.status();
  struct Todo {
    std::string model;
    RepositoryVersion version;
  };
  std::vector<Todo> todo;
  {
    absl::MutexLock l(&mu_);
    // What left the disk stops taking requests at once.
    for (auto& [name, versions] : models_) {
      auto on_disk = scan->find(name);
      for (auto& [v, e] : versions) {
        if (on_disk != scan->end() && FindVersion(on_disk->second, v) != nullptr) continue;
        if (e.state == VersionState::kReady) Retire(e, "removed from the repository", &dropped);
        if (e.state == VersionState::kFailed) e.state = VersionState::kUnloaded;
      }
    }
    // What the policy wants and is not loaded: loaded below, outside the lock.
    for (const auto& [name, versions] : *scan) {
      Versions& known = models_[name];
      const bool unloaded = unloaded_.count(name) != 0;  // listed, not loaded, until Load
      for (int64_t v : WantedVersions(config_.policy, versions)) {
        const RepositoryVersion& rv = *FindVersion(versions, v);
        auto k = known.find(v);
        if (unloaded) {
          if (k == known.end()) known[v] = Entry{VersionState::kUnloaded, "unloaded by request", rv.path};
          continue;
        }
        if (k != known.end()) {
          Entry& e = k->second;
          if (e.state == VersionState::kRetiring) {  // wanted again while still held
            if (std::shared_ptr<ServedVersion> held = Held(e)) {
              e.served = std::move(held);
              e.state = VersionState::kReady;
              e.reason.clear();
            }
          }
          const bool retry = StateOf(e) == VersionState::kUnloaded ||
                             (e.state == VersionState::kFailed && (e.over_budget || !(e.stamp == StampOf(rv.path))));
          if (!retry) continue;
        }
        Entry& e = known[v];
        e = Entry();
        e.path = rv.path;
        e.stamp = StampOf(rv.path);
        todo.push_back({name, rv});
      }
    }
  }
  for (const Todo& t : todo) LoadOne(t.model, t.version);
  // A version the policy dropped retires once a newer wanted one is ready.
  absl::MutexLock l(&mu_);
  for (const auto& [name, versions] : *scan) {
    const std::vector<int64_t> wanted = WantedVersions(config_.policy, versions);
    Versions& known = models_[name];
    int64_t newest_ready = 0;
    for (int64_t w : wanted) {
      auto k = known.find(w);
      if (k != known.end() && k->second.state == VersionState::kReady) newest_ready = std::max(newest_ready, w);
    }
    for (auto& [v, e] : known) {
      if (e.state == VersionState::kReady && !Contains(wanted, v) && v < newest_ready) {
        Retire(e,
               absl::StrCat("replaced by version ", newest_ready, " (version policy ",
                            VersionPolicyName(config_.policy), ")"),
               &dropped);
      }
    }
  }
  return absl::OkStatus();
}

std::string ModelRepository::OverBudget(const std::string& model, int64_t version, int64_t need) const {
  std::string holders;
  const int64_t used = BytesInUse(model, version, &holders);
  if (used + need <= budget_) return "";
  return absl::StrCat("needs ", need, " bytes, and --model_memory_budget ", budget_, budget_note_, " has ",
                      std::max<int64_t>(0, budget_ - used), " left (", holders.empty() ? "nothing" : holders, " held)");
}

int64_t ModelRepository::BytesInUse(const std::string& model, int64_t version, std::string* holders) const {
  int64_t used = 0;
  for (const auto& [name, versions] : models_) {
    for (const auto& [v, e] : versions) {
      if (name == model && v == version) continue;
      const VersionState state = StateOf(e);
      if (e.bytes == 0 ||
          !(state == VersionState::kLoading || state == VersionState::kReady || state == VersionState::kRetiring)) {
        continue;
      }
      used += e.bytes;
      absl::StrAppend(holders, holders->empty() ? "" : ", ", name, " version ", v, " ", VersionStateName(state), " ",
                      e.bytes);
    }
  }
  return used;
}

void ModelRepository::LoadOne(const std::string& model, const RepositoryVersion& v) {
  {
    absl::MutexLock l(&mu_);
    if (unloaded_.count(model) != 0) {  // Unload ran since the poll chose it
      Entry& e = models_[model][v.version];
      e.state = VersionState::kUnloaded;
      e.reason = "unloaded by request";
      return;
    }
  }
  if (sizer_ != nullptr) {  // every version is sized (HeldBytes); only a budget refuses one
    absl::StatusOr<int64_t> need = sizer_(v);
    absl::MutexLock l(&mu_);
    Entry& e = models_[model][v.version];
    if (budget_ > 0) {
      if (!need.ok()) {
        e.state = VersionState::kFailed;
        e.reason = std::string(need.status().message());
        return;
      }
      if (std::string over = OverBudget(model, v.version, *need); !over.empty()) {
        e.state = VersionState::kFailed;
        e.over_budget = true;
        e.reason = std::move(over);
        return;
      }
    }
    e.bytes = need.value_or(0);  // counted from now, so that a load beside this one sees it
  }
  absl::StatusOr<std::shared_ptr<ServedVersion>> loaded = loader_(model, v);
  absl::MutexLock l(&mu_);  // released before `loaded` (an engine) is destroyed
  Entry& e = models_[model][v.version];
  if (unloaded_.count(model) != 0) {  // Unload ran during the load
    e.state = VersionState::kUnloaded;
    e.reason = "unloaded by request";
    e.bytes = 0;
  } else if (loaded.ok() && *loaded != nullptr) {
    e.state = VersionState::kReady;
    e.owner = *loaded;
    e.served = Released(*std::move(loaded));
  } else {
    e.state = VersionState::kFailed;
    e.reason = loaded.ok() ? "the loader returned nothing" : std::string(loaded.status().message());
    e.bytes = 0;
  }
}

absl::Status ModelRepository::Unload(const std::string& model) {
  Dropped dropped;  // released after the lock
  absl::MutexLock l(&mu_);
  auto m = models_.find(model);
  if (m == models_.end()) return absl::NotFoundError(absl::StrCat("model \"", model, "\" is not in the repository"));
  unloaded_.insert(model);
  for (auto& [v, e] : m->second) {
    if (e.state == VersionState::kReady) {
      Retire(e, "unloaded by request", &dropped);
    } else if (e.state == VersionState::kFailed) {
      e.state = VersionState::kUnloaded;
      e.reason = "unloaded by request";
    }
  }
  return absl::OkStatus();
}

bool ModelRepository::Unloaded(const std::string& model) const {
  absl::MutexLock l(&mu_);
  return unloaded_.count(model) != 0;
}

absl::Status ModelRepository::Load(const std::string& model) {
  ASSIGN_OR_RETURN(const auto scan, ScanRepository(config_.dir));
  if (scan.count(model) == 0) {
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" is not in ", config_.dir));
  }
  {
    absl::MutexLock l(&mu_);
    unloaded_.erase(model);
  }
  RETURN_IF_ERROR(Poll());
  absl::MutexLock l(&mu_);
  std::vector<std::string> why;
  for (const auto& [v, e] : models_[model]) {
    if (e.state == VersionState::kReady) return absl::OkStatus();
    if (e.state == VersionState::kFailed) why.push_back(absl::StrCat("version ", v, ": ", e.reason));
  }
  return absl::FailedPreconditionError(absl::StrCat("model \"", model, "\" has no ready version",
                                                    why.empty() ? "" : " (", absl::StrJoin(why, "; "),
                                                    why.empty() ? "" : ")"));
}

absl::StatusOr<std::shared_ptr<ServedVersion>> ModelRepository::Keep(const std::string& model, int64_t version) {
  absl::MutexLock poll(&poll_mu_);  // no poll chooses this version meanwhile
  {
    absl::MutexLock l(&mu_);
    auto m = models_.find(model);
    if (m != models_.end()) {
      auto v = m->second.find(version);
      if (v != m->second.end()) {
        if (v->second.state == VersionState::kReady) return v->second.served;
        if (std::shared_ptr<ServedVersion> held = Held(v->second)) return held;
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<RepositoryVersion> versions, ListVersions(config_.dir + "/" + model));
  const RepositoryVersion* rv = FindVersion(versions, version);
  if (rv == nullptr) {
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" version ", version, " is not in ", config_.dir));
  }
  int64_t bytes = 0;
  if (sizer_ != nullptr) {  // the budget holds here too: the sessions wait in the state store
    absl::StatusOr<int64_t> need = sizer_(*rv);
    absl::MutexLock l(&mu_);
    if (budget_ > 0) {
      if (!need.ok()) return need.status();
      if (std::string over = OverBudget(model, version, *need); !over.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat("model \"", model, "\" version ", version, " ", over));
      }
    }
    bytes = need.value_or(0);
  }
  absl::StatusOr<std::shared_ptr<ServedVersion>> made = loader_(model, *rv);
  if (!made.ok()) {  // RESOURCE_EXHAUSTED means the budget alone (recovery.cc waits on it)
    return absl::IsResourceExhausted(made.status()) ? absl::FailedPreconditionError(made.status().message())
                                                    : made.status();
  }
  std::shared_ptr<ServedVersion> owner = *std::move(made);
  if (owner == nullptr) return absl::InternalError("the loader returned nothing");
  const std::weak_ptr<ServedVersion> weak_owner = owner;
  std::shared_ptr<ServedVersion> loaded = Released(std::move(owner));
  absl::MutexLock l(&mu_);
  Entry& e = models_[model][version];
  e = Entry();
  e.state = VersionState::kRetiring;
  e.reason = "kept for the sessions recovered on it (the version policy serves another)";
  e.path = rv->path;
  e.stamp = StampOf(rv->path);
  e.bytes = bytes;
  e.retiring = loaded;
  e.owner = weak_owner;
  return loaded;
}

absl::StatusOr<ModelRepository::Found> ModelRepository::Find(const std::string& model, int64_t version) const {
  absl::MutexLock l(&mu_);
  auto m = models_.find(model);
  if (m == models_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, versions] : models_) names.push_back(name);
    return absl::NotFoundError(absl::StrCat(
        "model \"", model, "\" is not served (served: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  if (version == 0) {
    for (auto it = m->second.rbegin(); it != m->second.rend(); ++it) {
      if (it->second.state == VersionState::kReady) return Found{it->first, it->second.served};
    }
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no ready version"));
  }
  auto v = m->second.find(version);
  if (v == m->second.end()) {
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no version ", version));
  }
  if (v->second.state != VersionState::kReady) {
    const Entry& e = v->second;
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" version ", version, " is ",
                                            VersionStateName(StateOf(e)), e.reason.empty() ? "" : ": ", e.reason));
  }
  return Found{version, v->second.served};
}

std::shared_ptr<ServedVersion> ModelRepository::Released(std::shared_ptr<ServedVersion> owner) const {
  ServedVersion* const version = owner.get();
  return std::shared_ptr<ServedVersion>(version, [owner = std::move(owner), slot = releaser_](ServedVersion*) mutable {
    VersionReleaser releaser;
    {
      absl::MutexLock l(&slot->mu);
      releaser = slot->releaser;
    }
    if (!releaser || !releaser(&owner)) owner.reset();  // freed here
  });
}

std::shared_ptr<ServedVersion> ModelRepository::Held(Entry& e) const {
  if (std::shared_ptr<ServedVersion> held = e.retiring.lock()) return held;
  std::shared_ptr<ServedVersion> owner = e.owner.lock();  // let go of, and not freed yet
  if (owner == nullptr) return nullptr;
  std::shared_ptr<ServedVersion> again = Released(std::move(owner));
  e.retiring = again;
  return again;
}

void ModelRepository::SetReleaser(VersionReleaser releaser) {
  absl::MutexLock l(&releaser_->mu);
  releaser_->releaser = std::move(releaser);
}

std::vector<std::shared_ptr<ServedVersion>> ModelRepository::Ready() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<ServedVersion>> out;
  for (const auto& [name, versions] : models_) {
    for (const auto& [v, e] : versions) {
      if (e.state == VersionState::kReady) out.push_back(e.served);
    }
  }
  return out;
}

std::vector<std::shared_ptr<ServedVersion>> ModelRepository::Loaded() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<ServedVersion>> out;
  for (const auto& [name, versions] : models_) {
    for (const auto& [v, e] : versions) {
      if (e.state == VersionState::kReady) {
        out.push_back(e.served);
      } else if (std::shared_ptr<ServedVersion> held = e.retiring.lock()) {
        out.push_back(std::move(held));
      }
    }
  }
  return out;
}

std::vector<VersionStatus> ModelRepository::List() const {
  absl::MutexLock l(&mu_);
  std::vector<VersionStatus> out;
  for (const auto& [name, versions] : models_) {
    for (const auto& [v, e] : versions) out.push_back({name, v, StateOf(e), e.reason, e.path});
  }
  return out;
}

}  // namespace txl
