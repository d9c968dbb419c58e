#include "server/batching/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/batching/text_stream.h"
#include "base/status_macros.h"
#include "base/echo_id.h"

namespace txl {

// One request as the engine thread sees it.
class Job : public std::enable_shared_from_this<Job> {
 public:
  enum class Kind { kGenerate, kScore, kFork, kExport, kImport, kAdopt };

  Kind kind;
  SessionLease lease;
  bool throwaway = false;
  JobCallbacks callbacks;
  std::atomic<bool> cancelled{false};
  // Set by another thread: the client cannot take more output (0: not paused;
  // else when it was paused, in unix nanoseconds).
  std::atomic<int64_t> paused_since{0};
  absl::Time submitted = absl::Now();

  // Tokens to feed: the session's pending token, then the input.
  std::vector<int> feed;
  size_t fed = 0;          // of `feed`
  size_t pending_len = 0;  // how many of `feed` were the session's pending tokens

  // Generate.
  GenerateSpec spec;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  bool decoding = false;  // prefill done; feeding back sampled tokens
  int last = -1;          // the last sampled token (unfed)
  absl::Time last_token_at;

  // Score.
  bool commit = true;
  std::unique_ptr<EngineSession> scratch;  // commit=false works on a copy

  // Fork, Import: the new session's settings.
  absl::Duration fork_ttl;
  std::map<std::string, std::string> fork_labels;
  // Import.
  Scheduler::ImportSpec import;
  // Adopt.
  std::string adopt_caller, adopt_id;

  // History bookkeeping for the journal: the session's position when the
  // job was submitted, how far its history is logged, the tokens sampled.
  int64_t start_position = 0, logged_position = 0;
  std::vector<int> generated;

  JobResult result;
  bool done = false;

  EngineSession* state() { return scratch ? scratch.get() : lease.state.get(); }
  // Rows still to feed before the job needs no more prefill.
  size_t prefill_left() const {
    // Score never feeds its last token (it stays pending): nothing predicts past it.
    const size_t total = kind == Kind::kScore ? (feed.empty() ? 0 : feed.size() - 1) : feed.size();
    return total > fed ? total - fed : 0;
  }
};

namespace {

double Since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

constexpr char kStalledPayload[] = "txl.stalled";

}  // namespace

absl::Status StalledError(absl::Duration waited) {
  absl::Status s = absl::CancelledError(
      absl::StrCat("the client read none of its stream for ", absl::FormatDuration(waited),
                   " (--stream_stall_timeout); the call was cancelled and the session keeps what was generated"));
  s.SetPayload(kStalledPayload, absl::Cord("1"));
  return s;
}

bool IsStalled(const absl::Status& status) { return status.GetPayload(kStalledPayload).has_value(); }

Scheduler::Scheduler(const SchedulerConfig& config, Engine* engine, SessionTable* table,
                     const Tokenizer* tokenizer, SchedulerObserver* observer)
    : config_(config), engine_(engine), table_(table), tokenizer_(tokenizer), observer_(observer) {}

Scheduler::~Scheduler() {
  Stop();
  // The journal may outlive this scheduler: its writer thread must not call into it.
  if (journal_ != nullptr) journal_->SetHandoffHandler(nullptr);
}

void Scheduler::SetJournal(SessionJournal* journal) {
  journal_ = journal;
  if (journal_ == nullptr) return;
  journal_->SetHandoffHandler([this](std::vector<std::string> ids) {
    absl::MutexLock lock(&mu_);
    wanted_.insert(ids.begin(), ids.end());
  });
}

void Scheduler::HandOff() {
  std::set<std::string> wanted;
  {
    absl::MutexLock lock(&mu_);
    wanted.swap(wanted_);
  }
  for (const std::string& id : wanted) {
    auto lease = table_->TakeForSnapshot(id, /*any_tier=*/true);
    if (absl::IsNotFound(lease.status())) continue;
    if (!lease.ok() || !lease->durable) {  // busy: at the next heartbeat
      continue;
    }
    if (lease->state) {  // its current state, so the next replica replays nothing
      if (auto image = ExportImage(*lease); image.ok()) journal_->RecordSnapshot(id, *std::move(image));
    }
    journal_->RecordRelease(id);
    table_->Discard(*std::move(lease));
  }
}

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t Scheduler::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

absl::Status Scheduler::Import(Job& job) {
  const ImportSpec& spec = job.import;
  ASSIGN_OR_RETURN(std::unique_ptr<EngineSession> state, engine_->RestoreSession(spec.image.state));
  if (state->mem_len() > spec.max_mem_len) {
    return absl::InvalidArgumentError(absl::StrCat("import: the session's mem_len ", state->mem_len(),
                                                   " is more than this server allows (max_mem_len=",
                                                   spec.max_mem_len, ")"));
  }
  if (state->fed() + static_cast<int64_t>(spec.image.pending.size()) != spec.image.position) {
    return absl::InvalidArgumentError("session export: the position does not match the state");
  }
  for (int t : spec.image.pending) {
    if (t < 0 || t >= engine_->vocab_size())
      return absl::InvalidArgumentError("session export: a pending token is outside the vocabulary");
  }
  ASSIGN_OR_RETURN(SessionLease lease,
                   table_->CreateAcquired(spec.owner, std::move(state), spec.idle_ttl, spec.labels, absl::Now(),
                                          spec.id, /*durable=*/journal_ != nullptr));
  lease.pending = spec.image.pending;
  const std::string id = lease.id;
  if (journal_) {
    ASSIGN_OR_RETURN(SessionInfo info, table_->Get(spec.owner, id));
    RecordNewSession(job, info, std::move(lease), EncodeSessionExport(spec.image));
    return absl::OkStatus();
  }
  table_->Release(std::move(lease), absl::Now());
  ASSIGN_OR_RETURN(job.result.forked, table_->Get(spec.owner, id));
  return absl::OkStatus();
}

void Scheduler::ReturnLease(Job& job) {
  if (job.lease.id.empty()) return;  // no session (import, adopt) or given back already
  if (job.throwaway) {
    table_->Discard(std::move(job.lease));
  } else {
    table_->Release(std::move(job.lease), absl::Now());
  }
  job.lease = SessionLease();
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::Enqueue(std::shared_ptr<Job> job) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (static_cast<int64_t>(queue_.size()) >= config_.max_queue) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("the request queue is full (max_queue=", config_.max_queue, ")"));
    } else {
      queue_.push_back(job);
      if (observer_) observer_->OnQueueDepth(static_cast<int64_t>(queue_.size()));
      return job;
    }
  }
  ReturnLease(*job);
  return refused;
}

absl::Status Scheduler::CheckWritable(const SessionLease& lease, bool throwaway) const {
  if (journal_ == nullptr || !lease.durable || throwaway) return absl::OkStatus();
  return journal_->Writable();
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitGenerate(SessionLease lease, bool throwaway,
                                                               GenerateSpec spec,
                                                               JobCallbacks callbacks) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kGenerate;
  job->throwaway = throwaway;
  job->callbacks = std::move(callbacks);
  job->lease = std::move(lease);
  absl::Status invalid;
  if (spec.input.empty() && job->lease.position() == 0) {
    invalid = absl::InvalidArgumentError(
        "input: empty, and the session has no history to continue from");
  } else if (auto s = ValidateSampling(spec.sampling); !s.ok()) {
    invalid = s;
  } else if (auto w = CheckWritable(job->lease, throwaway); !w.ok()) {
    invalid = w;
  }
  if (!invalid.ok()) {
    ReturnLease(*job);
    return invalid;
  }
  job->start_position = job->logged_position = job->lease.position();
  // The pending token stays in the lease until the job ends (Finish settles
  // it): a job refused by Enqueue hands the session back unchanged.
  job->feed = job->lease.pending;
  job->pending_len = job->feed.size();
  job->feed.insert(job->feed.end(), spec.input.begin(), spec.input.end());
  job->result.input_tokens = static_cast<int64_t>(spec.input.size());
  job->sampler = std::make_unique<Sampler>(spec.sampling, std::random_device{}());
  job->text = std::make_unique<TextStream>(spec.stop_sequences);
  job->spec = std::move(spec);
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitScore(SessionLease lease, bool throwaway,
                                                            std::vector<int> input, bool commit,
                                                            JobCallbacks callbacks) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kScore;
  job->throwaway = throwaway;
  job->callbacks = std::move(callbacks);
  job->lease = std::move(lease);
  if (input.empty()) {
    ReturnLease(*job);
    return absl::InvalidArgumentError("input: must hold at least one token");
  }
  if (commit) {  // scoring without commit changes nothing: a read-only session still answers it
    if (auto w = CheckWritable(job->lease, throwaway); !w.ok()) {
      ReturnLease(*job);
      return w;
    }
  }
  job->commit = commit;
  job->start_position = job->logged_position = job->lease.position();
  job->feed = job->lease.pending;  // kept in the lease until the job commits
  job->pending_len = job->feed.size();
  job->feed.insert(job->feed.end(), input.begin(), input.end());
  job->result.input_tokens = static_cast<int64_t>(input.size());
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitFork(SessionLease source, absl::Duration idle_ttl,
                                                           std::map<std::string, std::string> labels,
                                                           JobCallbacks callbacks) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kFork;
  job->callbacks = std::move(callbacks);
  job->lease = std::move(source);
  if (auto w = CheckWritable(job->lease, false); !w.ok()) {  // the fork would be journaled
    ReturnLease(*job);
    return w;
  }
  job->fork_ttl = idle_ttl;
  job->fork_labels = std::move(labels);
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitExport(SessionLease lease, JobCallbacks callbacks) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kExport;
  job->callbacks = std::move(callbacks);
  job->lease = std::move(lease);
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitImport(ImportSpec spec, JobCallbacks callbacks) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kImport;
  job->callbacks = std::move(callbacks);
  job->import = std::move(spec);
  if (journal_ != nullptr) {
    if (auto w = journal_->Writable(); !w.ok()) return w;
  }
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitAdopt(std::string caller, std::string id,
                                                            JobCallbacks callbacks) {
  if (journal_ == nullptr) return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kAdopt;
  job->callbacks = std::move(callbacks);
  job->adopt_caller = std::move(caller);
  job->adopt_id = std::move(id);
  return Enqueue(std::move(job));
}

bool Scheduler::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

void Scheduler::Cancel(const std::shared_ptr<Job>& job) {
  job->cancelled.store(true);
  absl::MutexLock lock(&mu_);  // a loop whose jobs are all paused wakes to end it
  ++resumed_;
}

void Scheduler::Pause(const std::shared_ptr<Job>& job) {
  int64_t none = 0;
  job->paused_since.compare_exchange_strong(none, absl::ToUnixNanos(absl::Now()));
}

void Scheduler::Resume(const std::shared_ptr<Job>& job) {
  if (job->paused_since.exchange(0) == 0) return;
  absl::MutexLock lock(&mu_);  // releasing it re-checks the engine thread's wait
  ++resumed_;
}

void Scheduler::Finish(Job& job, absl::Status status) {
  if (job.done) return;
  job.done = true;
  // Settle the session's pending token so that "position = fed + pending"
  // holds whatever happened: a finished generation leaves its last sampled
  // token pending; a job stopped part-way keeps the prefix it fed (plus the
  // next token as the pending one); a job that fed nothing changes nothing.
  const bool on_scratch = job.kind == Job::Kind::kScore && !job.commit;
  if (job.kind == Job::Kind::kGenerate && job.decoding) {
    job.lease.pending = {job.last};
  } else if (job.kind == Job::Kind::kScore && job.commit && status.ok()) {
    job.lease.pending = {job.feed.back()};
  } else if (!on_scratch && job.fed > 0) {
    job.lease.pending = {job.feed[job.fed]};
  } else if (job.kind == Job::Kind::kGenerate) {
    job.lease.pending.assign(job.feed.begin(), job.feed.begin() + job.pending_len);
  }
  if (job.kind == Job::Kind::kGenerate && job.decoding && job.result.finish != Finish::kStopSequence) {
    job.result.trailing_text = job.text->Finish();
  }
  job.scratch.reset();
  job.result.session_id = job.lease.id;
  if (job.lease.state) {
    job.result.position = job.lease.position();
    LogHistory(job, job.result.position);
    if (journal_ && job.lease.durable && !job.throwaway && job.lease.since_snapshot >= config_.snapshot_tokens) {
      if (auto image = ExportImage(job.lease); image.ok()) {
        journal_->RecordSnapshot(job.lease.id, *std::move(image));
        job.lease.since_snapshot = 0;
      }
    }
  }
  job.result.total_seconds = Since(job.submitted);
  active_count_.fetch_sub(1);
  const bool logs = journal_ != nullptr && job.lease.durable && !job.throwaway && !job.lease.id.empty() &&
                    (job.kind == Job::Kind::kGenerate || (job.kind == Job::Kind::kScore && job.commit));
  if (logs) {
    // The session stays busy until the journal has its history: if the
    // store failed, it rolls back to what the store holds before anyone
    // (this client's retry included) sees it. Runs on the writer thread.
    auto held = std::make_shared<SessionLease>(std::move(job.lease));
    job.lease = SessionLease();
    const int64_t position = job.result.position;
    journal_->AfterDurable(
        held->id, position,
        [table = table_, held, done = std::move(job.callbacks.on_done), status = std::move(status),
         result = std::move(job.result)](absl::Status written, int64_t durable) mutable {
          if (!written.ok()) {
            // The history past `durable` never happened: the state is
            // rebuilt from the store on the session's next request.
            held->state.reset();
            held->idle.reset();
            held->pending.clear();
            held->known_position = durable;
            held->since_snapshot = 0;
            result.position = durable;
          }
          table->Release(std::move(*held), absl::Now());
          if (done) done(written.ok() ? std::move(status) : std::move(written), std::move(result));
        });
    return;
  }
  const bool durable = job.lease.durable || job.kind == Job::Kind::kImport || job.kind == Job::Kind::kAdopt ||
                       job.kind == Job::Kind::kFork;
  ReturnLease(job);
  if (job.callbacks.on_done) {
    Ack(durable, [done = std::move(job.callbacks.on_done), status = std::move(status),
                  result = std::move(job.result)](absl::Status) mutable { done(std::move(status), std::move(result)); });
  }
}

absl::StatusOr<std::string> Scheduler::ExportImage(const SessionLease& lease) const {
  SessionExport image;
  image.fingerprint = engine_->fingerprint();
  image.position = lease.position();
  image.pending = lease.pending;
  RETURN_IF_ERROR(lease.state->AppendTo(&image.state));
  return EncodeSessionExport(image);
}

void Scheduler::Ack(bool durable, std::function<void(absl::Status)> fn) {
  if (journal_ != nullptr && durable) {
    journal_->After(std::move(fn));
  } else {
    fn(absl::OkStatus());
  }
}

void Scheduler::LogHistory(Job& job, int64_t position) {
  if (journal_ == nullptr || !job.lease.durable || job.throwaway) return;
  if (job.kind != Job::Kind::kGenerate && !(job.kind == Job::Kind::kScore && job.commit)) return;
  if (position <= job.logged_position) return;
  // The history the job adds: its input, then what it sampled.
  const int64_t n_input = static_cast<int64_t>(job.feed.size() - job.pending_len);
  std::vector<int> tokens;
  for (int64_t i = job.logged_position - job.start_position; i < position - job.start_position; ++i) {
    tokens.push_back(i < n_input ? job.feed[job.pending_len + i] : job.generated[i - n_input]);
  }
  journal_->RecordTokens(job.lease.id, job.logged_position, std::move(tokens));
  job.lease.since_snapshot += position - job.logged_position;
  job.logged_position = position;
}

void Scheduler::RecordNewSession(Job& job, const SessionInfo& info, SessionLease lease, std::string snapshot) {
  SessionMeta meta{info.id, info.owner, info.mem_len, info.idle_ttl, info.created, info.labels};
  auto held = std::make_shared<SessionLease>(std::move(lease));
  // The job's answer waits for the creation: it may still find the id taken.
  auto done = std::move(job.callbacks.on_done);
  job.callbacks.on_done = nullptr;
  SessionInfo answer = info;
  answer.busy = false;
  journal_->RecordCreate(meta, std::move(snapshot),
                         [table = table_, held, done, answer](absl::Status written) mutable {
                           if (written.ok()) {
                             table->Release(std::move(*held), absl::Now());
                           } else {
                             table->Discard(std::move(*held));
                           }
                           if (!done) return;
                           JobResult result;
                           result.forked = answer;
                           result.session_id = answer.id;
                           done(written, std::move(result));
                         });
}

std::shared_ptr<IdleSession> IdleFromRecord(const JournalRecord& record, std::vector<int>* pending) {
  auto idle = std::make_shared<IdleSession>();
  idle->state = record.image.state;
  idle->mem_len = record.meta.mem_len;
  idle->feed = record.image.pending;
  idle->feed.insert(idle->feed.end(), record.tail.begin(), record.tail.end());
  pending->clear();
  if (!idle->feed.empty()) {
    pending->push_back(idle->feed.back());
    idle->feed.pop_back();
  }
  return idle;
}

absl::StatusOr<int> RecoverSessions(SessionJournal* journal, SessionTable* table, const std::string& fingerprint) {
  ASSIGN_OR_RETURN(std::vector<std::string> held, journal->Held());
  int recovered = 0;
  for (const std::string& id : held) {
    auto record = journal->Load(id);  // DATA_LOSS: reported and quarantined by Load
    if (!record.ok()) continue;
    if (record->image.fingerprint != fingerprint) {
      std::fprintf(stderr, "txl-server: session %s not recovered: it belongs to model %s, this server serves %s\n",
                   id.c_str(), record->image.fingerprint.c_str(), fingerprint.c_str());
      continue;
    }
    std::vector<int> pending;
    auto idle = IdleFromRecord(*record, &pending);
    if (table->AddIdle(id, record->meta.owner, record->meta.idle_ttl, record->meta.labels, record->meta.created,
                       std::move(idle), std::move(pending), record->position(),
                       static_cast<int64_t>(record->tail.size()))
            .ok())
      ++recovered;
  }
  return recovered;
}

absl::StatusOr<std::unique_ptr<EngineSession>> Scheduler::Rebuild(const IdleSession& idle) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngineSession> state,
                   idle.state.empty() ? engine_->NewSession(idle.mem_len) : engine_->RestoreSession(idle.state));
  for (size_t at = 0; at < idle.feed.size(); at += static_cast<size_t>(config_.prefill_chunk)) {
    const size_t n = std::min(idle.feed.size() - at, static_cast<size_t>(config_.prefill_chunk));
    EngineInput in;
    in.session = state.get();
    in.tokens.assign(idle.feed.begin() + at, idle.feed.begin() + at + n);
    RETURN_IF_ERROR(engine_->Step(absl::MakeSpan(&in, 1)).status());
  }
  return state;
}

absl::Status Scheduler::Materialize(Job& job) {
  const absl::Time start = absl::Now();
  const char* from = "host";
  std::shared_ptr<const IdleSession> idle = job.lease.idle;
  if (!idle) {  // acquired while being offloaded: the image is in the store's entry now
    idle = table_->TakeIdle(job.lease.id);
    job.lease.idle = idle;
  }
  if (!idle) {
    from = "store";
    if (journal_ == nullptr) return absl::InternalError("the session has no state");
    (void)journal_->Flush();  // its last tokens may still be on their way
    auto record = journal_->Load(job.lease.id);
    if (!record.ok()) {
      if (absl::IsDataLoss(record.status()) || absl::IsNotFound(record.status())) job.throwaway = true;  // gone for good
      if (absl::IsDataLoss(record.status())) (void)journal_->TakeQuarantined(job.lease.id, job.lease.owner);  // told now
      return record.status();
    }
    if (record->position() != job.lease.known_position) {
      job.throwaway = true;
      return absl::DataLossError(absl::StrCat("session ", EchoId(job.lease.id), ": the state store has position ",
                                              record->position(), ", expected ", job.lease.known_position));
    }
    std::vector<int> pending;
    idle = IdleFromRecord(*record, &pending);
    if (job.lease.pending.empty() && !pending.empty()) {
      // Rolled back after a store failure (Finish): the pending token is
      // only in the store. It goes before what the job was given to feed.
      job.feed.insert(job.feed.begin(), pending.begin(), pending.end());
      job.pending_len += pending.size();
      job.lease.pending = std::move(pending);
    }
  }
  ASSIGN_OR_RETURN(job.lease.state, Rebuild(*idle));
  job.lease.idle.reset();
  if (observer_) observer_->OnRestore(from, Since(start));
  return absl::OkStatus();
}

absl::Status Scheduler::Adopt(Job& job) {
  ASSIGN_OR_RETURN(JournalRecord record, journal_->Adopt(job.adopt_id, job.adopt_caller));
  std::vector<int> pending;
  std::shared_ptr<IdleSession> idle = IdleFromRecord(record, &pending);
  absl::Status s = table_->AddIdle(record.meta.id, record.meta.owner, record.meta.idle_ttl, record.meta.labels,
                                   record.meta.created, std::move(idle), std::move(pending), record.position(),
                                   static_cast<int64_t>(record.tail.size()));
  return absl::IsAlreadyExists(s) ? absl::OkStatus() : s;  // a concurrent adoption got here first
}

void Scheduler::Offload(bool tick) {
  bool moved = false;
  for (const std::string& id : table_->DeviceOverflow()) {
    const absl::Time start = absl::Now();
    // Not busy meanwhile: a request arriving now waits in the queue, not ABORTED.
    std::unique_ptr<EngineSession> state = table_->BeginOffload(id);
    if (!state) continue;
    auto idle = std::make_shared<IdleSession>();
    idle->mem_len = state->mem_len();
    if (!state->AppendTo(&idle->state).ok()) {  // no image: it stays in device memory
      table_->AbortOffload(id, std::move(state));
      continue;
    }
    table_->FinishOffload(id, std::move(idle));
    moved = true;
    if (observer_) observer_->OnOffload("host", Since(start));
  }
  if (!moved && !tick) return;
  for (const std::string& id : table_->HostOverflow()) {
    const absl::Time start = absl::Now();
    table_->DropToStateStore(id);  // the journal holds it already
    if (observer_) observer_->OnOffload("store", Since(start));
  }
}

absl::Status Scheduler::SnapshotAll() {
  if (journal_ == nullptr) return absl::OkStatus();
  // Sessions whose last job's history is being written are busy until it is: settle that first.
  (void)journal_->Flush();
  for (const std::string& id : table_->Ids()) {
    auto lease = table_->TakeForSnapshot(id);  // idle and in device memory
    if (!lease.ok()) continue;
    if (lease->durable) {
      if (auto image = ExportImage(*lease); image.ok()) {
        journal_->RecordSnapshot(id, *std::move(image));
        lease->since_snapshot = 0;
      }
    }
    table_->Release(*std::move(lease), absl::Now());
  }
  return journal_->Flush();
}

void Scheduler::Loop() {
  std::vector<std::shared_ptr<Job>> active;
  absl::Time last_expiry = absl::Now();
  while (true) {
    if (absl::Now() - last_expiry >= absl::Seconds(1)) {
      last_expiry = absl::Now();
      std::vector<std::string> durable;
      const int expired = table_->ExpireIdle(last_expiry, &durable);
      if (expired > 0 && observer_) observer_->OnSessionsExpired(expired);
      if (journal_) {
        for (const std::string& id : durable) journal_->RecordDelete(id);
        HandOff();
      }
      Offload(/*tick=*/true);
      if (observer_) observer_->OnTick();
    }
    {
      absl::MutexLock lock(&mu_);
      // Jobs paused for their clients (Pause) do not keep the loop spinning.
      bool runnable = false;
      for (const auto& job : active) runnable = runnable || job->paused_since.load() == 0;
      const int64_t resumed = resumed_;
      auto ready = [this, runnable, resumed]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty() || runnable || resumed_ != resumed;
      };
      // Wakes at least once a second to expire idle sessions.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stopping_) {
        for (auto& job : queue_) {
          active.push_back(job);
          active_count_.fetch_add(1);
        }
        queue_.clear();
      }
      // A cancelled job (its client's deadline passed while it waited) leaves
      // the queue now, not when a batch slot frees: its session must not stay busy.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (!(*it)->cancelled.load()) {
          ++it;
          continue;
        }
        active.push_back(*it);
        active_count_.fetch_add(1);
        it = queue_.erase(it);
        if (observer_) observer_->OnQueueDepth(static_cast<int64_t>(queue_.size()));
      }
      // Paused jobs (clients that do not read) hold no batch slot: waiting
      // for them must not keep other requests out.
      int running = 0;
      for (const auto& job : active) running += job->paused_since.load() == 0 ? 1 : 0;
      while (!queue_.empty() && running < config_.max_batch) {
        ++running;
        active.push_back(queue_.front());
        queue_.pop_front();
        active_count_.fetch_add(1);
        if (observer_) observer_->OnQueueDepth(static_cast<int64_t>(queue_.size()));
      }
      if (stopping_) {
        for (auto& job : active) job->cancelled.store(true);
      }
    }
    if (active.empty()) {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      continue;
    }
    RunStep(active);
    Offload(/*tick=*/false);
    active.erase(std::remove_if(active.begin(), active.end(), [](const auto& j) { return j->done; }),
                 active.end());
  }
}

void Scheduler::RunStep(std::vector<std::shared_ptr<Job>>& active) {
  // Cancelled jobs, forks and jobs with nothing to run end here.
  for (auto& job : active) {
    if (job->cancelled.load()) {
      job->result.finish = Finish::kCancelled;
      Finish(*job, job->kind == Job::Kind::kGenerate && job->decoding
                       ? absl::OkStatus()
                       : absl::CancelledError("the request was cancelled"));
      continue;
    }
    if (const int64_t since = job->paused_since.load(); since != 0) {
      const absl::Duration waited = absl::Now() - absl::FromUnixNanos(since);
      if (waited >= config_.stall_timeout) {
        job->result.finish = Finish::kCancelled;
        Finish(*job, StalledError(waited));
        continue;
      }
    }
    if (job->result.queue_seconds == 0) job->result.queue_seconds = Since(job->submitted);
    if (!job->lease.id.empty() && !job->lease.state) {  // offloaded: back into device memory first
      if (auto s = Materialize(*job); !s.ok()) {
        Finish(*job, s);
        continue;
      }
    }
    if (job->kind == Job::Kind::kAdopt) {
      Finish(*job, Adopt(*job));
      continue;
    }
    if (job->kind == Job::Kind::kFork) {
      auto copy = job->lease.state->Clone();
      if (!copy.ok()) {
        Finish(*job, copy.status());
        continue;
      }
      // The fork belongs to whoever may use the source (its owner, the caller).
      const bool durable = journal_ != nullptr && job->lease.durable;  // a fork of a journaled session is too
      auto lease = table_->CreateAcquired(job->lease.owner, *std::move(copy), job->fork_ttl, job->fork_labels,
                                          absl::Now(), SessionTable::NewId(job->lease.id), durable);
      if (!lease.ok()) {
        Finish(*job, lease.status());
        continue;
      }
      lease->pending = job->lease.pending;
      const std::string id = lease->id;
      if (durable) {
        auto image = ExportImage(*lease);
        auto info = table_->Get(job->lease.owner, id);
        if (!image.ok() || !info.ok()) {
          table_->Discard(*std::move(lease));
          Finish(*job, image.ok() ? info.status() : image.status());
          continue;
        }
        RecordNewSession(*job, *info, *std::move(lease), *std::move(image));
        Finish(*job, absl::OkStatus());
        continue;
      }
      table_->Release(*std::move(lease), absl::Now());
      auto info = table_->Get(job->lease.owner, id);
      if (info.ok()) job->result.forked = *info;
      Finish(*job, info.status());
      continue;
    }
    if (job->kind == Job::Kind::kExport) {
      auto image = ExportImage(job->lease);
      if (image.ok()) job->result.exported = *std::move(image);
      Finish(*job, image.status());
      continue;
    }
    if (job->kind == Job::Kind::kImport) {
      Finish(*job, Import(*job));
      continue;
    }
    if (job->kind == Job::Kind::kScore && !job->commit && !job->scratch) {
      auto copy = job->lease.state->Clone();
      if (!copy.ok()) {
        Finish(*job, copy.status());
        continue;
      }
      job->scratch = *std::move(copy);
    }
    if (job->kind == Job::Kind::kScore && job->prefill_left() == 0) {
      // Only one token, and nothing before it: nothing to predict.
      if (job->result.scores.empty()) {
        for (size_t i = job->pending_len; i < job->feed.size(); ++i)
          job->result.scores.push_back({job->feed[i], false, 0.0f});
      }
      Finish(*job, absl::OkStatus());
    }
  }

  // Build the batch: decoders first, then prefill chunks in arrival order.
  std::vector<Job*> rows;
  std::vector<EngineInput> inputs;
  int64_t budget = config_.max_batch_tokens;
  // Resumed jobs may make more decoders than max_batch for a while: they
  // take turns (the start rotates), so none waits for the others to end.
  std::vector<Job*> decoders;
  for (auto& job : active) {
    if (!job->done && job->decoding && job->paused_since.load() == 0) decoders.push_back(job.get());
  }
  const size_t first = decoders.size() > static_cast<size_t>(config_.max_batch) ? rotate_++ % decoders.size() : 0;
  for (size_t k = 0; k < decoders.size() && static_cast<int>(rows.size()) < config_.max_batch; ++k) {
    Job* job = decoders[(first + k) % decoders.size()];
    EngineInput in;
    in.session = job->state();
    in.tokens = {job->last};
    in.want_distribution = true;
    rows.push_back(job);
    inputs.push_back(std::move(in));
    --budget;
  }
  for (auto& job : active) {
    if (static_cast<int>(rows.size()) >= config_.max_batch) break;
    if (job->done || job->decoding) continue;
    const size_t left = job->prefill_left();
    if (left == 0) continue;
    int64_t n = std::min<int64_t>({static_cast<int64_t>(left), config_.prefill_chunk, budget});
    if (n <= 0) {
      if (!rows.empty()) break;
      n = std::min<int64_t>(static_cast<int64_t>(left), config_.prefill_chunk);  // always progress
    }
    EngineInput in;
    in.session = job->state();
    in.tokens.assign(job->feed.begin() + job->fed, job->feed.begin() + job->fed + n);
    if (job->kind == Job::Kind::kScore) {
      in.targets.assign(job->feed.begin() + job->fed + 1, job->feed.begin() + job->fed + n + 1);
    } else {
      in.want_distribution = static_cast<size_t>(n) == left;
    }
    rows.push_back(job.get());
    inputs.push_back(std::move(in));
    budget -= n;
  }
  if (rows.empty()) return;

  std::vector<int64_t> fed_counts;
  int64_t total_tokens = 0;
  for (const EngineInput& in : inputs) {
    fed_counts.push_back(static_cast<int64_t>(in.tokens.size()));
    total_tokens += static_cast<int64_t>(in.tokens.size());
  }
  const absl::Time step_start = absl::Now();
  absl::StatusOr<std::vector<StepOutput>> out = engine_->Step(absl::MakeSpan(inputs));
  if (observer_) {
    observer_->OnStep(static_cast<int>(rows.size()), total_tokens, Since(step_start));
    observer_->OnTokensFed(total_tokens);
  }
  if (!out.ok()) {
    for (Job* job : rows) Finish(*job, absl::InternalError(out.status().message()));
    return;
  }

  const int64_t V = engine_->vocab_size();
  for (size_t r = 0; r < rows.size(); ++r) {
    Job& job = *rows[r];
    StepOutput& o = (*out)[r];
    if (!job.decoding) job.fed += static_cast<size_t>(fed_counts[r]);
    if (job.kind == Job::Kind::kScore) {
      // Scores come for feed positions fed-n+1 .. fed; report input tokens only.
      const size_t first_target = job.fed - static_cast<size_t>(fed_counts[r]) + 1;
      if (job.result.scores.empty() && job.pending_len == 0) {
        job.result.scores.push_back({job.feed[0], false, 0.0f});  // the session's first token
      }
      for (size_t k = 0; k < o.target_logprobs.size(); ++k) {
        const size_t pos = first_target + k;
        if (pos >= job.pending_len) job.result.scores.push_back({job.feed[pos], true, o.target_logprobs[k]});
      }
      if (job.prefill_left() == 0) Finish(job, absl::OkStatus());
      continue;
    }
    // Generate: a distribution arrives after the prefill and after each decode.
    if (o.last_distribution.size() != static_cast<size_t>(V)) continue;  // mid-prefill chunk
    const int token = job.sampler->Sample(o.last_distribution);
    GeneratedTokenEvent ev;
    ev.id = token;
    ev.logprob = o.last_distribution[token];
    if (job.spec.top_logprobs > 0) ev.top = TopN(o.last_distribution, job.spec.top_logprobs);
    absl::StatusOr<std::string> bytes = tokenizer_->TokenText(token);
    TextStream::Update text = job.text->Push(bytes.ok() ? *bytes : std::string());
    ev.text = std::move(text.text);
    const absl::Time now = absl::Now();
    if (observer_) {
      observer_->OnTokensGenerated(1);
      if (job.result.generated_tokens == 0) {
        observer_->OnFirstToken(Since(job.submitted));
      } else {
        observer_->OnInterTokenGap(absl::ToDoubleSeconds(now - job.last_token_at));
      }
    }
    if (job.result.generated_tokens == 0) job.result.first_token_seconds = Since(job.submitted);
    job.last_token_at = now;
    job.decoding = true;
    job.last = token;
    ++job.result.generated_tokens;
    const int64_t position = job.lease.state->fed() + 1;  // the sampled token, pending
    job.generated.push_back(token);
    LogHistory(job, position);
    if (job.callbacks.on_tokens) {
      if (journal_ != nullptr && job.lease.durable && !job.throwaway) {
        // Sent once written; if the store failed, the job stops (its end rolls the session back).
        journal_->AfterDurable(job.lease.id, position,
                               [cb = job.callbacks.on_tokens, ev = std::move(ev), position,
                                weak = job.weak_from_this()](absl::Status written, int64_t) mutable {
                                 if (written.ok()) {
                                   cb({std::move(ev)}, position);
                                 } else if (auto j = weak.lock()) {
                                   j->cancelled.store(true);
                                 }
                               });
      } else {
        job.callbacks.on_tokens({std::move(ev)}, position);
      }
    }

    const bool stop_token = std::find(job.spec.stop_token_ids.begin(), job.spec.stop_token_ids.end(),
                                      token) != job.spec.stop_token_ids.end();
    if (text.stopped) {
      job.result.finish = Finish::kStopSequence;
      Finish(job, absl::OkStatus());
    } else if (stop_token) {
      job.result.finish = Finish::kStopToken;
      Finish(job, absl::OkStatus());
    } else if (job.result.generated_tokens >= job.spec.max_new_tokens) {
      job.result.finish = Finish::kLength;
      Finish(job, absl::OkStatus());
    } else if (job.cancelled.load()) {
      job.result.finish = Finish::kCancelled;
      Finish(job, absl::OkStatus());
    }
  }
}

}  // namespace txl
