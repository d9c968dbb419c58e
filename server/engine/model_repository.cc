#include "server/engine/model_repository.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
                                                                         VersionLoader loader) {
  std::unique_ptr<ModelRepository> r(new ModelRepository(config, std::move(loader)));
  if (absl::Status s = r->Poll(); !s.ok()) return s;
  return r;
}

ModelRepository::Stamp ModelRepository::StampOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void ModelRepository::Retire(Entry& e, const std::string& why) {
  e.retiring = e.served;
  e.served.reset();
  e.state = VersionState::kRetiring;
  e.reason = why;
}

VersionState ModelRepository::StateOf(const Entry& e) {
  return e.state == VersionState::kRetiring && e.retiring.expired() ? VersionState::kUnloaded : e.state;
}

absl::Status ModelRepository::Poll() {
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
        if (e.state == VersionState::kReady) Retire(e, "removed from the repository");
        if (e.state == VersionState::kFailed) e.state = VersionState::kUnloaded;
      }
    }
    // What the policy wants and is not loaded: loaded below, outside the lock.
    for (const auto& [name, versions] : *scan) {
      Versions& known = models_[name];
      for (int64_t v : WantedVersions(config_.policy, versions)) {
        const RepositoryVersion& rv = *FindVersion(versions, v);
        auto k = known.find(v);
        if (k != known.end()) {
          Entry& e = k->second;
          if (e.state == VersionState::kRetiring && !e.retiring.expired()) {  // wanted again while still held
            e.served = e.retiring.lock();
            e.state = VersionState::kReady;
            e.reason.clear();
          }
          const bool retry = StateOf(e) == VersionState::kUnloaded ||
                             (e.state == VersionState::kFailed && !(e.stamp == StampOf(rv.path)));
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
  for (const Todo& t : todo) {
    auto loaded = loader_(t.model, t.version);
    absl::MutexLock l(&mu_);
    Entry& e = models_[t.model][t.version.version];
    if (loaded.ok() && *loaded != nullptr) {
      e.state = VersionState::kReady;
      e.served = std::move(*loaded);
    } else {
      e.state = VersionState::kFailed;
      e.reason = loaded.ok() ? "the loader returned nothing" : std::string(loaded.status().message());
    }
  }
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
        Retire(e, absl::StrCat("replaced by version ", newest_ready, " (version policy ",
                               VersionPolicyName(config_.policy), ")"));
      }
    }
  }
  return absl::OkStatus();
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

std::vector<VersionStatus> ModelRepository::List() const {
  absl::MutexLock l(&mu_);
  std::vector<VersionStatus> out;
  for (const auto& [name, versions] : models_) {
    for (const auto& [v, e] : versions) out.push_back({name, v, StateOf(e), e.reason, e.path});
  }
  return out;
}

}  // namespace txl
