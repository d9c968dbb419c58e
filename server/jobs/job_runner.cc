#include "server/jobs/job_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/status_macros.h"
#include "server/durability/new_session.h"
#include "server/durability/recovery.h"
#include "server/sessions/session_export.h"

namespace txl {

double SecondsSince(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

namespace {
// An engine image's bytes beyond its memory's (SessionState::AppendTo's header).
constexpr int64_t kImageHeaderRoom = 4096;
}  // namespace

JobRunner::JobRunner(const SchedulerConfig& config, SessionTable* table, SchedulerObserver* observer)
    : config_(config), table_(table), observer_(observer) {
  const int64_t budget = table_->checkpoints().config().budget_bytes;
  if (config_.checkpoint_buffers > 0 && budget > 0) {
    ImageBuffersConfig buffers;
    buffers.stock = config_.checkpoint_buffers;
    buffers.max_bytes = std::max<int64_t>(1, std::min<int64_t>(buffers.max_bytes, budget / 4));
    if (auto made = ImageBuffers::Create(buffers); made.ok()) image_buffers_ = *std::move(made);
  }
}

bool JobRunner::Prepare(Job& job) {
  if (job.cancelled.load()) {
    // A generation stopped mid-stream succeeded with what it sent.
    const bool decoding = job.feeding() != nullptr && job.feeding()->decoding();
    Finish(job, decoding ? absl::OkStatus() : absl::CancelledError("the request was cancelled"));
    return false;
  }
  if (const int64_t since = job.paused_since.load(); since != 0) {
    const absl::Duration waited = absl::Now() - absl::FromUnixNanos(since);
    if (waited >= config_.stall_timeout) {
      Finish(job, StalledError(waited));
      return false;
    }
  }
  if (job.times.queue_seconds == 0) job.times.queue_seconds = SecondsSince(job.submitted);
  if (journaled(job) && !job.lease.id.empty()) {
    // Served from this replica's copy only while it holds the session: one
    // that another replica took over (this one paused) is let go, and the
    // client's retry adopts the one history from the store.
    if (absl::Status held = journal_->CheckHold(job.lease.id); !held.ok()) {
      if (journal_->Lost(job.lease.id)) job.lease.throwaway = true;
      Finish(job, held);
      return false;
    }
  }
  if (!job.lease.id.empty() && !job.lease.state) {  // offloaded: back into device memory first
    if (absl::Status s = Materialize(job); !s.ok()) {
      Finish(job, s);
      return false;
    }
  }
  return true;
}

void JobRunner::Finish(Job& job, absl::Status status) {
  if (job.done) return;
  job.done = true;
  FeedJob* feed = job.feeding();
  if (feed != nullptr) feed->Settle(status);
  int64_t position = 0;
  if (job.lease.state) {
    position = job.lease.position();
    if (feed != nullptr) {
      if (feed->ExtendHistory(table_->config().history_tokens) && !job.lease.throwaway) Checkpoint(job.lease);
      feed->LogHistory(*this, position);
    }
    if (journaled(job) && job.lease.since_snapshot >= config_.snapshot_tokens) {
      if (auto image = ExportImage(job.lease); image.ok()) {
        journal_->RecordSnapshot(job.lease.id, *std::move(image));
        job.lease.since_snapshot = 0;
      }
    }
  }
  job.times.total_seconds = SecondsSince(job.submitted);
  active.fetch_sub(1);
  Job::Answer answer = job.TakeAnswer();
  if (journaled(job) && !job.lease.id.empty() && feed != nullptr && feed->logs_history()) {
    // The session stays busy until the journal has its history: if the
    // state store failed, it rolls back to what it holds before anyone
    // (this client's retry included) sees it. Runs on the writer thread.
    auto held = std::make_shared<SessionLease>(std::move(job.lease));
    job.lease = SessionLease();
    journal_->AfterDurable(held->id, position,
                           [table = table_, held, answer = std::move(answer), status = std::move(status), position](
                               absl::Status written, int64_t durable) mutable {
                             if (written.ok()) {
                               table->Release(std::move(*held), absl::Now());
                             } else {
                               // The history past `durable` never happened: the state is
                               // rebuilt from the state store on the session's next request.
                               table->GiveBackRolledBack(std::move(*held), durable, absl::Now());
                             }
                             if (answer)
                               answer(written.ok() ? std::move(status) : std::move(written),
                                      written.ok() ? position : durable);
                           });
    return;
  }
  const bool durable = job.acks_durably();
  ReturnLease(job);
  if (!answer) return;
  auto reply = [answer = std::move(answer), status = std::move(status), position](absl::Status) mutable {
    answer(std::move(status), position);
  };
  if (journal_ != nullptr && durable) {
    journal_->After(std::move(reply));  // after what the journal was given before
  } else {
    reply(absl::OkStatus());
  }
}

void JobRunner::ReturnLease(Job& job) {
  if (job.lease.id.empty()) return;  // no session (import, adopt) or given back already
  table_->GiveBack(std::move(job.lease), absl::Now());
  job.lease = SessionLease();
}

void JobRunner::Checkpoint(const SessionLease& lease) {
  CheckpointStore& store = table_->checkpoints();
  const int64_t bytes = lease.state->memory_bytes();
  if (!store.WouldKeep(bytes)) return;
  // Room for the memory and the image's header, its pages touched already.
  auto image =
      std::make_shared<std::string>(image_buffers_ ? image_buffers_->Take(bytes + kImageHeaderRoom) : std::string());
  if (!lease.state->AppendTo(image.get()).ok()) return;  // a cache: a failed copy only costs a replay later
  store.Put(lease.id, lease.position(), std::move(image), lease.pending);
}

absl::StatusOr<std::string> JobRunner::ExportImage(const SessionLease& lease) const {
  SessionExport image;
  image.fingerprint = EngineOf(lease).fingerprint();
  if (lease.model != nullptr) image.model = lease.model->ref();
  image.position = lease.position();
  image.pending = lease.pending;
  RETURN_IF_ERROR(lease.state->AppendTo(&image.state));
  return EncodeSessionExport(image);
}

void JobRunner::RecordNewSession(const SessionInfo& info, SessionLease lease, std::string snapshot, SessionMade done) {
  // The answer waits for the creation: it may still find the id taken.
  txl::RecordNewSession(journal_, table_, info, std::move(lease), std::move(snapshot),
                        [done = std::move(done)](absl::Status written, const SessionInfo& made) {
                          if (!done) return;
                          if (written.ok()) {
                            done(made);
                          } else {
                            done(std::move(written));
                          }
                        });
}

void JobRunner::SendTokens(Job& job, const TokensCallback& on_tokens, GeneratedTokenEvent event, int64_t position) {
  if (!on_tokens) return;
  if (!journaled(job)) {
    on_tokens({std::move(event)}, position);
    return;
  }
  // Sent once written; if the state store failed, the job stops (its end rolls the session back).
  journal_->AfterDurable(job.lease.id, position,
                         [cb = on_tokens, event = std::move(event), position, weak = job.weak_from_this()](
                             absl::Status written, int64_t) mutable {
                           if (written.ok()) {
                             cb({std::move(event)}, position);
                           } else if (auto j = weak.lock()) {
                             j->cancelled.store(true);
                           }
                         });
}

std::string JobRunner::CacheScope(const SessionLease& lease) const {
  const Engine& engine = EngineOf(lease);
  return absl::StrCat(lease.owner, "\n", engine.fingerprint(), "\n", engine.numerics(), "\n", lease.state->mem_len());
}

std::optional<size_t> JobRunner::FromStateCache(SessionLease& lease, absl::Span<const int> tokens, size_t at_least) {
  StateCache& cache = table_->state_cache();
  if (!cache.enabled()) return std::nullopt;
  const std::string scope = CacheScope(lease);
  CacheLookup how = CacheLookup::kHit;
  std::optional<CachedState> hit = cache.Longest(scope, tokens);
  if (!hit && shared_cache_ != nullptr) {  // kept by another replica (or by this one, before a restart)
    hit = shared_cache_->Longest(scope, tokens);
    how = CacheLookup::kStoreHit;
    if (hit)
      cache.Put(scope, tokens.first(hit->position), *hit, EngineOf(lease).ReceptiveField(lease.state->mem_len()));
  }
  const size_t held = hit ? static_cast<size_t>(hit->position) - hit->pending.size() : 0;  // fed into the image
  std::unique_ptr<SessionState> state;
  if (hit && held > at_least) {  // else bounded replay feeds no more
    auto restored = EngineOf(lease).RestoreSession(*hit->image);
    if (restored.ok() && (*restored)->position() == static_cast<int64_t>(held)) state = *std::move(restored);
  }
  if (!state) {
    cache.Count(CacheLookup::kMiss, 0);
    return std::nullopt;
  }
  lease.state = std::move(state);
  cache.Count(how, static_cast<int64_t>(held - at_least));
  return held;
}

void JobRunner::KeepInStateCache(const SessionLease& lease, absl::Span<const int> tokens, std::vector<int> pending) {
  StateCache& cache = table_->state_cache();
  if (!cache.enabled() || !lease.throwaway || !lease.state ||
      lease.state->position() + static_cast<int64_t>(pending.size()) != static_cast<int64_t>(tokens.size()))
    return;
  auto image = std::make_shared<std::string>();
  if (!lease.state->AppendTo(image.get()).ok()) return;  // a cache: a failed copy only costs a replay later
  CachedState state{static_cast<int64_t>(tokens.size()), std::move(image), std::move(pending)};
  const std::string scope = CacheScope(lease);
  const int64_t check = EngineOf(lease).ReceptiveField(lease.state->mem_len());
  if (shared_cache_ != nullptr) shared_cache_->Offer(scope, tokens, state, check);
  cache.Put(scope, tokens, std::move(state), check);
}

absl::Status JobRunner::CheckWritable(const SessionLease& lease) const {
  if (journal_ == nullptr || !lease.durable || lease.throwaway) return absl::OkStatus();
  return journal_->Writable();
}

absl::StatusOr<std::unique_ptr<SessionState>> JobRunner::Rebuild(Engine& engine, const IdleSession& idle,
                                                                 RebuildFor rebuilt_for, int64_t* fed) {
  const size_t field = static_cast<size_t>(engine.ReceptiveField(idle.mem_len));
  const size_t skip = idle.feed.size() > field ? idle.feed.size() - field : 0;
  std::unique_ptr<SessionState> state;
  if (skip > 0 || idle.state.empty()) {  // the image, if any, is too far back to matter
    ASSIGN_OR_RETURN(state, engine.NewSessionAt(idle.mem_len, idle.start + static_cast<int64_t>(skip)));
  } else {
    ASSIGN_OR_RETURN(state, engine.RestoreSession(idle.state));
  }
  if (fed != nullptr) *fed = static_cast<int64_t>(idle.feed.size() - skip);
  for (size_t at = skip; at < idle.feed.size(); at += static_cast<size_t>(config_.prefill_chunk)) {
    const size_t n = std::min(idle.feed.size() - at, static_cast<size_t>(config_.prefill_chunk));
    StepInput in;
    in.session = state.get();
    in.tokens.assign(idle.feed.begin() + at, idle.feed.begin() + at + n);
    in.uncounted = rebuilt_for == RebuildFor::kBeside;
    RETURN_IF_ERROR(engine.Step(absl::MakeSpan(&in, 1)).status());
  }
  const int64_t end = idle.start + static_cast<int64_t>(idle.feed.size());
  if (state->position() != end) {  // an image that is not where its history says
    return absl::DataLossError(absl::StrCat("session state: the image is at position ",
                                            state->position() - static_cast<int64_t>(idle.feed.size()),
                                            " where its history has ", idle.start));
  }
  return state;
}

absl::Status JobRunner::Materialize(Job& job) {
  RETURN_IF_ERROR(table_->BringBack(job.lease.id));  // (before anything is read: it stays where it is)
  const absl::Time start = absl::Now();
  const char* from = "host";
  std::shared_ptr<const IdleSession> idle = job.lease.idle;
  if (!idle) {  // acquired while being offloaded: the image is in the table's entry now
    idle = table_->TakeIdle(job.lease.id);
    job.lease.idle = idle;
  }
  if (!idle) {
    from = "store";
    if (journal_ == nullptr) return absl::InternalError("the session has no state");
    (void)journal_->Flush();  // its last tokens may still be on their way
    auto record = journal_->Load(job.lease.id);
    if (!record.ok()) {
      if (absl::IsDataLoss(record.status()) || absl::IsNotFound(record.status()))
        job.lease.throwaway = true;  // gone for good
      if (absl::IsDataLoss(record.status()))
        (void)journal_->TakeQuarantined(job.lease.id, job.lease.owner);  // told now
      return record.status();
    }
    if (record->position() != job.lease.known_position) {
      job.lease.throwaway = true;
      return absl::DataLossError(absl::StrCat("session ", EchoId(job.lease.id), ": the state store has position ",
                                              record->position(), ", expected ", job.lease.known_position));
    }
    std::vector<int> pending;
    idle = IdleFromRecord(*record, &pending);
    if (job.lease.pending.empty() && !pending.empty()) {
      if (FeedJob* feed = job.feeding()) {
        feed->RestorePending(std::move(pending));
      } else {
        job.lease.pending = std::move(pending);
      }
    }
  }
  ASSIGN_OR_RETURN(job.lease.state, Rebuild(EngineOf(job.lease), *idle, RebuildFor::kTheSession));
  job.lease.idle.reset();
  if (observer_) observer_->OnRestore(from, SecondsSince(start));
  return absl::OkStatus();
}

}  // namespace txl
