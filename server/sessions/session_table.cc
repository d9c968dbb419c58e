#include "server/sessions/session_table.h"

#include <algorithm>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/echo_id.h"
#include "base/status_macros.h"

namespace txl {

std::string SessionTable::NewId(const std::string& same_route_as) {
  // 128 bits from the OS entropy source (std::random_device reads it on Linux);
  // a fork's id shares 32 of them with its source, known only to its holders.
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&id, "%08x", rd());
  if (same_route_as.size() >= kRoutePrefixChars) id.replace(0, kRoutePrefixChars, same_route_as, 0, kRoutePrefixChars);
  return id;
}

absl::StatusOr<absl::Duration> SessionTable::ResolveTtl(absl::Duration ttl) const {
  if (ttl < absl::ZeroDuration() || ttl > config_.max_ttl) {
    return absl::InvalidArgumentError(absl::StrCat("idle_ttl_seconds: must be in [0, ",
                                                   absl::ToInt64Seconds(config_.max_ttl), "], got ",
                                                   absl::ToInt64Seconds(ttl)));
  }
  return ttl == absl::ZeroDuration() ? config_.default_ttl : ttl;
}

void SessionTable::Refresh(Entry& e) {
  if (!e.state) {  // out of device memory: position and window are as they were
    e.info.memory_bytes = 0;
    return;
  }
  e.info.position = e.state->position() + static_cast<int64_t>(e.pending.size());
  e.info.mem_len = e.state->mem_len();
  e.info.memory_tokens = e.state->memory_tokens();
  e.info.memory_bytes = e.state->memory_bytes();
}

absl::StatusOr<SessionInfo> SessionTable::Create(const std::string& owner, std::shared_ptr<ServedModel> model,
                                                 std::unique_ptr<SessionState> state, absl::Duration idle_ttl,
                                                 std::map<std::string, std::string> labels, absl::Time now,
                                                 const std::string& id) {
  ASSIGN_OR_RETURN(SessionLease lease,
                   CreateAcquired(owner, std::move(model), std::move(state), idle_ttl, std::move(labels), now, id));
  const std::string created = lease.id;
  Release(std::move(lease), now);
  return Get(owner, created);
}

absl::StatusOr<SessionLease> SessionTable::CreateAcquired(const std::string& owner, std::shared_ptr<ServedModel> model,
                                                          std::unique_ptr<SessionState> state, absl::Duration idle_ttl,
                                                          std::map<std::string, std::string> labels, absl::Time now,
                                                          const std::string& requested, bool durable) {
  ASSIGN_OR_RETURN(const absl::Duration ttl, ResolveTtl(idle_ttl));
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(sessions_.size()) >= config_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session limit reached (max_sessions=", config_.max_sessions, ")"));
  }
  if (config_.max_sessions_per_principal > 0) {
    if (sessions_of_.Count(owner) >= config_.max_sessions_per_principal) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session limit of this principal reached (max_sessions_per_principal=", config_.max_sessions_per_principal,
          "); delete a session first"));
    }
  }
  if (model != nullptr && model->limits().max_sessions > 0) {
    if (sessions_by_model_.Count(model->name()) >= model->limits().max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session limit of model ", model->name(),
          " reached (its limits.json max_sessions=", model->limits().max_sessions, "); delete a session first"));
    }
  }
  const int64_t reserve = state->full_memory_bytes();
  if (!offloading() && config_.memory_budget_bytes > 0 && reserved_bytes_ + reserve > config_.memory_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session memory budget reached (session_memory_budget=", config_.memory_budget_bytes, " bytes; sessions hold ",
        reserved_bytes_, ", this one needs ", reserve, " at mem_len ", state->mem_len(), ")"));
  }
  if (!requested.empty() && sessions_.contains(requested)) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: ", EchoId(requested), " already exists"));
  }
  std::string id = requested.empty() ? NewId() : requested;
  while (sessions_.contains(id)) id = NewId();
  Entry& e = sessions_[id];
  e.info.id = id;
  e.info.owner = owner;
  e.model = model;
  if (model != nullptr) e.info.model = model->ref();
  sessions_of_.Add(owner, +1);
  CountModel(model.get(), +1);
  e.info.created = e.info.last_used = now;
  e.info.idle_ttl = ttl;
  e.info.labels = std::move(labels);
  e.info.busy = true;
  e.info.mem_len = state->mem_len();
  e.reserved_bytes = reserve;
  e.durable = durable;
  reserved_bytes_ += reserve;
  SessionLease lease;
  lease.id = id;
  lease.owner = owner;
  lease.model = std::move(model);
  lease.history = TokenHistory(state->position());
  lease.state = std::move(state);
  lease.durable = durable;
  return lease;
}

SessionLease SessionTable::CheckOut(const std::string& id, Entry& e) {
  e.info.busy = true;
  SessionLease lease;
  lease.id = id;
  lease.owner = e.info.owner;
  lease.model = e.model;
  lease.state = std::move(e.state);
  lease.pending = std::move(e.pending);
  lease.idle = std::move(e.idle);
  lease.known_position = e.info.position;
  lease.durable = e.durable;
  lease.since_snapshot = e.since_snapshot;
  lease.history = std::move(e.history);
  return lease;
}

absl::Status SessionTable::NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
}

SessionTable::Map::iterator SessionTable::FindOwned(const std::string& caller, const std::string& id) {
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.info.owner == caller ? it : sessions_.end();
}

SessionTable::Map::const_iterator SessionTable::FindOwned(const std::string& caller, const std::string& id) const {
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.info.owner == caller ? it : sessions_.end();
}

absl::StatusOr<SessionInfo> SessionTable::Get(const std::string& caller, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = FindOwned(caller, id);
  if (it == sessions_.end()) return NotFound(id);
  return it->second.info;
}

absl::StatusOr<std::shared_ptr<ServedModel>> SessionTable::ModelOf(const std::string& caller,
                                                                   const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = FindOwned(caller, id);
  if (it == sessions_.end()) return NotFound(id);
  return it->second.model;
}

std::map<std::string, int64_t> SessionTable::SessionsByModel() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int64_t> out;
  for (const auto& [id, e] : sessions_) ++out[e.info.model];
  return out;
}

std::vector<SessionInfo> SessionTable::List(const std::string& caller) const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, e] : sessions_)
    if (e.info.owner == caller) out.push_back(e.info);
  return out;
}

absl::Status SessionTable::Delete(const std::string& caller, const std::string& id) {
  // Freed after the lock is released: the state, then its version (the last
  // session of a retiring version frees its weights).
  std::shared_ptr<ServedModel> version;
  std::unique_ptr<SessionState> doomed;
  absl::MutexLock lock(&mu_);
  auto it = FindOwned(caller, id);
  if (it == sessions_.end()) return NotFound(id);
  if (it->second.info.busy)
    return absl::AbortedError(absl::StrCat("session ", EchoId(id), " is busy with another request"));
  doomed = std::move(it->second.state);
  version = Erase(it);
  return absl::OkStatus();
}

absl::StatusOr<SessionLease> SessionTable::Acquire(const std::string& caller, const std::string& id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = FindOwned(caller, id);  // before the busy check: ABORTED would tell that it exists
  if (it == sessions_.end()) return NotFound(id);
  Entry& e = it->second;
  if (e.info.busy) return absl::AbortedError(absl::StrCat("session ", EchoId(id), " is busy with another request"));
  e.info.last_used = now;
  SessionLease lease = CheckOut(id, e);
  // With offload its request brings it back into device memory now, and
  // offload makes room; without, its restore asks first (BringBack).
  if (!e.resident && offloading()) {
    e.resident = true;
    reserved_bytes_ += e.reserved_bytes;
  }
  return lease;
}

void SessionTable::Release(SessionLease lease, absl::Time now) {
  std::shared_ptr<ServedModel> previous;  // a migrated session's old version: let go after the lock
  absl::MutexLock lock(&mu_);
  Entry& e = sessions_[lease.id];
  if (lease.model != nullptr && lease.model != e.model) {  // migrated (MigrateJob)
    CountModel(e.model.get(), -1);
    CountModel(lease.model.get(), +1);
    previous = std::move(e.model);
    e.model = std::move(lease.model);
    e.info.model = e.model->ref();
  }
  e.state = std::move(lease.state);
  e.pending = std::move(lease.pending);
  e.since_snapshot = lease.since_snapshot;
  e.history = std::move(lease.history);
  e.durable = lease.durable;
  if (e.state) {        // back in device memory: its window's exact size, now that its state is there
    if (!e.resident) {  // (a restore that did not ask BringBack)
      e.resident = true;
      reserved_bytes_ += e.reserved_bytes;
    }
    reserved_bytes_ += e.state->full_memory_bytes() - e.reserved_bytes;
    e.reserved_bytes = e.state->full_memory_bytes();
  } else {  // it never made it back (its restore failed, or it never ran): still idle where it was
    if (lease.idle) e.idle = std::move(lease.idle);  // else the entry keeps what an offload left there
    e.info.position = lease.known_position;
    if (e.resident) reserved_bytes_ -= e.reserved_bytes;
    e.resident = false;
  }
  e.info.busy = false;
  e.info.last_used = now;
  Refresh(e);
}

void SessionLease::RollBack(int64_t durable) {
  state.reset();
  idle.reset();
  pending.clear();
  known_position = durable;
  since_snapshot = 0;
  history.Truncate(durable);
}

void SessionTable::GiveBack(SessionLease lease, absl::Time now) {
  if (lease.throwaway) {
    Discard(std::move(lease));
  } else {
    Release(std::move(lease), now);
  }
}

void SessionTable::GiveBackRolledBack(SessionLease lease, int64_t durable, absl::Time now) {
  lease.RollBack(durable);
  checkpoints_.DropAfter(lease.id, durable);
  Release(std::move(lease), now);
}

void SessionTable::Discard(SessionLease lease) {
  std::shared_ptr<ServedModel> version;  // after the state (the lease's, then this)
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(lease.id);
    if (it != sessions_.end()) version = Erase(it);
  }
  lease.state.reset();
}

int SessionTable::ExpireIdle(absl::Time now, std::vector<std::string>* durable) {
  std::vector<std::shared_ptr<ServedModel>> versions;  // freed after `doomed`, after the lock
  std::vector<std::unique_ptr<SessionState>> doomed;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const SessionInfo& info = it->second.info;
    if (!info.busy && now - info.last_used > info.idle_ttl) {
      if (durable && it->second.durable) durable->push_back(info.id);
      doomed.push_back(std::move(it->second.state));
      versions.push_back(Erase(it++));
    } else {
      ++it;
    }
  }
  return static_cast<int>(doomed.size());
}

int64_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

int64_t SessionTable::memory_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, e] : sessions_) total += e.info.memory_bytes;
  return total;
}

void SessionTable::CountModel(const ServedModel* model, int delta) {
  if (model == nullptr) return;
  sessions_by_model_.Add(model->name(), delta);
}

std::shared_ptr<ServedModel> SessionTable::Erase(Map::iterator it) {
  checkpoints_.Drop(it->first);
  if (it->second.resident) reserved_bytes_ -= it->second.reserved_bytes;
  sessions_of_.Add(it->second.info.owner, -1);
  CountModel(it->second.model.get(), -1);
  std::shared_ptr<ServedModel> version = std::move(it->second.model);
  sessions_.erase(it);
  return version;
}

int64_t SessionTable::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
}

int64_t SessionTable::busy_count() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, e] : sessions_) n += e.info.busy ? 1 : 0;
  return n;
}

absl::Status SessionTable::AddIdle(const std::string& id, const std::string& owner, std::shared_ptr<ServedModel> model,
                                   absl::Duration idle_ttl, std::map<std::string, std::string> labels,
                                   absl::Time created, std::shared_ptr<const IdleSession> idle,
                                   std::vector<int> pending, int64_t position, int64_t since_snapshot,
                                   TokenHistory history) {
  absl::MutexLock lock(&mu_);
  if (sessions_.contains(id))
    return absl::AlreadyExistsError(absl::StrCat("session ", EchoId(id), " is already live here"));
  Entry& e = sessions_[id];
  e.info.id = id;
  e.info.owner = owner;
  e.model = std::move(model);
  if (e.model != nullptr) e.info.model = e.model->ref();
  sessions_of_.Add(owner, +1);
  CountModel(e.model.get(), +1);  // a recovered session counts, even past its model's max_sessions
  e.info.created = created;
  e.info.last_used = absl::Now();
  e.info.idle_ttl = std::min(idle_ttl, config_.max_ttl);
  e.info.labels = std::move(labels);
  e.info.mem_len = idle->mem_len;
  e.info.position = position;
  e.pending = std::move(pending);
  e.idle = std::move(idle);
  e.resident = false;
  e.durable = true;
  e.since_snapshot = since_snapshot;  // its log's length: the next request may fold it
  e.history = std::move(history);
  // What it reserves once back in device memory (BringBack, or Acquire with
  // offload): its window's, counted before its restore runs, as an
  // offloaded session's is. (A window out of range counts nothing: its
  // restore refuses it.)
  const int64_t window =
      e.model != nullptr && e.model->engine() != nullptr ? e.model->engine()->FullMemoryBytes(e.info.mem_len) : 0;
  e.reserved_bytes = window == std::numeric_limits<int64_t>::max() ? 0 : window;
  return absl::OkStatus();
}

namespace {

// Ids of the least recently used entries that `pick` accepts, oldest first,
// until their `size`s add up to `over`.
template <typename Map, typename Pick, typename Size>
std::vector<std::string> OldestCovering(const Map& sessions, int64_t over, Pick pick, Size size) {
  std::vector<std::string> out;
  if (over <= 0) return out;
  std::vector<std::pair<absl::Time, const typename Map::mapped_type*>> candidates;
  for (const auto& [id, e] : sessions) {
    if (pick(e)) candidates.emplace_back(e.info.last_used, &e);
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [t, e] : candidates) {
    if (over <= 0) break;
    out.push_back(e->info.id);
    over -= size(*e);
  }
  return out;
}

}  // namespace

absl::Status SessionTable::BringBack(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.resident) return absl::OkStatus();
  Entry& e = it->second;
  if (config_.memory_budget_bytes > 0 && reserved_bytes_ + e.reserved_bytes > config_.memory_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session memory budget reached (session_memory_budget=", config_.memory_budget_bytes,
                     " bytes; sessions hold ", reserved_bytes_, ", bringing session ", EchoId(id),
                     " back into device memory needs ", e.reserved_bytes, "): delete a session first"));
  }
  e.resident = true;
  reserved_bytes_ += e.reserved_bytes;
  return absl::OkStatus();
}

std::vector<std::string> SessionTable::DeviceOverflow() const {
  if (!offloading() || config_.memory_budget_bytes <= 0) return {};
  absl::MutexLock lock(&mu_);
  return OldestCovering(
      sessions_, reserved_bytes_ - config_.memory_budget_bytes,
      [](const Entry& e) { return !e.info.busy && e.state != nullptr; },
      [](const Entry& e) { return e.reserved_bytes; });
}

std::vector<std::string> SessionTable::HostOverflow() const {
  if (!offloading() || !config_.has_state_store) return {};
  absl::MutexLock lock(&mu_);
  const auto in_host = [](const Entry& e) { return !e.info.busy && e.idle && e.durable; };
  int64_t host = 0;
  for (const auto& [id, e] : sessions_) host += in_host(e) ? e.idle->bytes() : 0;
  return OldestCovering(sessions_, host - config_.host_memory_budget_bytes, in_host,
                        [](const Entry& e) { return e.idle->bytes(); });
}

absl::StatusOr<SessionLease> SessionTable::TakeForSnapshot(const std::string& id, bool any_tier) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NotFound(id);
  Entry& e = it->second;
  if (e.info.busy || (!e.state && !any_tier))
    return absl::AbortedError(absl::StrCat("session ", EchoId(id), " is busy"));
  return CheckOut(id, e);
}

std::unique_ptr<SessionState> SessionTable::BeginOffload(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.info.busy || !it->second.state) return nullptr;
  it->second.info.memory_bytes = 0;
  return std::move(it->second.state);
}

void SessionTable::FinishOffload(const std::string& id, std::shared_ptr<const IdleSession> idle) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;  // deleted meanwhile
  Entry& e = it->second;
  e.idle = std::move(idle);
  if (e.info.busy) return;  // acquired meanwhile: on its way back to device memory
  if (e.resident) reserved_bytes_ -= e.reserved_bytes;
  e.resident = false;
}

void SessionTable::AbortOffload(const std::string& id, std::unique_ptr<SessionState> state) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.info.busy) return;  // a request has it: it falls back to the journal
  it->second.state = std::move(state);
  Refresh(it->second);
}

std::shared_ptr<const IdleSession> SessionTable::TakeIdle(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  return std::move(it->second.idle);
}

void SessionTable::DropToStateStore(const std::string& id) {
  std::shared_ptr<const IdleSession> freed;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.info.busy || !it->second.durable) return;
  freed = std::move(it->second.idle);
}

std::vector<std::string> SessionTable::Ids() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : sessions_) out.push_back(id);
  return out;
}

SessionTable::TierCounts SessionTable::tiers() const {
  absl::MutexLock lock(&mu_);
  TierCounts t;
  for (const auto& [id, e] : sessions_) {
    if (e.resident) {
      ++t.device;
      t.device_bytes += e.reserved_bytes;
    } else if (e.idle) {
      ++t.host;
      t.host_bytes += e.idle->bytes();
    } else {
      ++t.state_store;
    }
  }
  return t;
}

}  // namespace txl
