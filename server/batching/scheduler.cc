#include "server/batching/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "server/jobs/generate_job.h"
#include "server/jobs/score_job.h"

namespace txl {

Scheduler::Scheduler(const SchedulerConfig& config, SessionTable* table, SchedulerObserver* observer)
    : runner_(config, table, observer), batch_(&runner_), offloader_(&runner_) {}

Scheduler::~Scheduler() {
  Stop();
  // The journal may outlive this scheduler: its writer thread must not call into it.
  if (runner_.journal() != nullptr) runner_.journal()->SetHandoffHandler(nullptr);
}

void Scheduler::SetJournal(SessionJournal* journal) {
  runner_.set_journal(journal);
  if (journal == nullptr) return;
  journal->SetHandoffHandler([this](std::vector<std::string> ids) { offloader_.Want(ids); });
}

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool Scheduler::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
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

absl::StatusOr<std::shared_ptr<Job>> Scheduler::Enqueue(std::shared_ptr<Job> job, bool admitted) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    const int max_queue = runner_.config().max_queue;
    if (draining_ && !admitted) {
      refused = absl::UnavailableError("the server is shutting down");
    } else if (static_cast<int64_t>(queue_.size()) >= max_queue && !admitted) {
      refused = absl::ResourceExhaustedError(absl::StrCat("the request queue is full (max_queue=", max_queue, ")"));
    } else {
      queue_.push_back(job);
      if (runner_.observer()) runner_.observer()->OnQueueDepth(static_cast<int64_t>(queue_.size()));
      return job;
    }
  }
  runner_.ReturnLease(*job);
  return refused;
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::EnqueueWritable(std::shared_ptr<Job> job) {
  if (absl::Status w = runner_.CheckWritable(job->lease); !w.ok()) {
    runner_.ReturnLease(*job);
    return w;
  }
  return Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitGenerate(SessionLease lease, GenerateSpec spec,
                                                               GenerateCallbacks callbacks) {
  return EnqueueWritable(std::make_shared<GenerateJob>(std::move(lease), std::move(spec), std::move(callbacks)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitScore(SessionLease lease, std::vector<int> input, bool commit,
                                                            ScoreDone done) {
  auto job = std::make_shared<ScoreJob>(std::move(lease), input, commit, std::move(done));
  // Scoring without commit changes nothing: a read-only session still answers it.
  return commit ? EnqueueWritable(std::move(job)) : Enqueue(std::move(job));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitBranch(SessionLease lease, std::vector<int> input, int copies,
                                                             BranchDone done) {
  return EnqueueWritable(std::make_shared<BranchJob>(std::move(lease), input, copies, std::move(done)));
}

std::shared_ptr<Job> Scheduler::SubmitChoice(SessionLease lease, GenerateSpec spec, GenerateCallbacks callbacks) {
  // Never refused: a throw-away session is never journaled, and its call was admitted.
  return *Enqueue(std::make_shared<GenerateJob>(std::move(lease), std::move(spec), std::move(callbacks)),
                  /*admitted=*/true);
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitFork(SessionLease source, absl::Duration idle_ttl,
                                                           std::map<std::string, std::string> labels, int64_t position,
                                                           SessionMade done) {
  // The fork would be journaled.
  return EnqueueWritable(
      std::make_shared<ForkJob>(std::move(source), idle_ttl, std::move(labels), position, std::move(done)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitRewind(SessionLease lease, int64_t position, JobDone done) {
  return EnqueueWritable(std::make_shared<RewindJob>(std::move(lease), position, std::move(done)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitMigrate(SessionLease lease, std::shared_ptr<ServedModel> to,
                                                              JobDone done) {
  return EnqueueWritable(std::make_shared<MigrateJob>(std::move(lease), std::move(to), std::move(done)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitExport(SessionLease lease, ExportDone done) {
  return Enqueue(std::make_shared<ExportJob>(std::move(lease), std::move(done)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitImport(ImportSpec spec, SessionMade done) {
  if (runner_.journal() != nullptr) {
    if (absl::Status w = runner_.journal()->Writable(); !w.ok()) return w;
  }
  return Enqueue(std::make_shared<ImportJob>(std::move(spec), std::move(done)));
}

absl::StatusOr<std::shared_ptr<Job>> Scheduler::SubmitAdopt(std::string caller, std::string id, RecordModel model_of,
                                                            JobDone done) {
  if (runner_.journal() == nullptr) return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
  return Enqueue(std::make_shared<AdoptJob>(std::move(caller), std::move(id), std::move(model_of), std::move(done)));
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

// The engine thread: admit, run each job, one batched step, offload.
void Scheduler::Loop() {
  std::vector<std::shared_ptr<Job>> active;
  absl::Time last_tick = absl::Now();
  while (true) {
    if (absl::Now() - last_tick >= absl::Seconds(1)) {
      last_tick = absl::Now();
      Tick();
    }
    if (!Admit(active)) return;
    if (active.empty()) continue;
    for (const auto& job : active) {
      if (!job->done && runner_.Prepare(*job)) job->Run(runner_);
    }
    batch_.Run(active);
    offloader_.Offload(/*tick=*/false);
    active.erase(std::remove_if(active.begin(), active.end(), [](const auto& j) { return j->done; }), active.end());
  }
}

void Scheduler::Tick() {
  SessionJournal* journal = runner_.journal();
  SchedulerObserver* observer = runner_.observer();
  std::vector<std::string> durable;
  const absl::Time now = absl::Now();
  int expired = runner_.table()->ExpireIdle(now, &durable);
  if (journal) {
    for (const std::string& id : durable) journal->RecordDelete(id);
    expired += journal->ExpireWaiting(now);  // those held out of the table, waiting for room for their version
    offloader_.HandOff();
  }
  if (expired > 0 && observer) observer->OnSessionsExpired(expired);
  offloader_.Offload(/*tick=*/true);
  if (observer) observer->OnTick();
}

void Scheduler::TakeFromQueue(std::shared_ptr<Job> job, std::vector<std::shared_ptr<Job>>& active) {
  active.push_back(std::move(job));
  runner_.active.fetch_add(1);
}

bool Scheduler::Admit(std::vector<std::shared_ptr<Job>>& active) {
  absl::MutexLock lock(&mu_);
  // Jobs paused for their clients (Pause) do not keep the loop spinning.
  bool runnable = false;
  for (const auto& job : active) runnable = runnable || job->paused_since.load() == 0;
  const int64_t resumed = resumed_;
  auto ready = [this, runnable, resumed]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty() || runnable || resumed_ != resumed;
  };
  // Wakes at least once a second for the tick.
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
  const size_t queued = queue_.size();
  if (stopping_) {
    for (auto& job : queue_) TakeFromQueue(job, active);
    queue_.clear();
  }
  // A cancelled job (its client's deadline passed while it waited) leaves
  // the queue now, not when a batch slot frees: its session must not stay busy.
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled.load()) {
      TakeFromQueue(*it, active);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  // Paused jobs (clients that do not read) hold no batch slot: waiting for
  // them must not keep other requests out.
  int running = 0;
  for (const auto& job : active) running += job->paused_since.load() == 0 ? 1 : 0;
  while (!queue_.empty() && running < runner_.config().max_batch) {
    ++running;
    TakeFromQueue(queue_.front(), active);
    queue_.pop_front();
  }
  if (queue_.size() != queued && runner_.observer()) {
    runner_.observer()->OnQueueDepth(static_cast<int64_t>(queue_.size()));
  }
  if (stopping_) {
    for (auto& job : active) job->cancelled.store(true);
  }
  return !(stopping_ && active.empty());
}

}  // namespace txl
