// The one-shot kinds: jobs that run once on the engine thread, between
// steps, because they touch session states (fork_job.cc, rewind_job.cc,
// export_job.cc, import_job.cc, adopt_job.cc).
#ifndef TXL_SERVER_JOBS_SESSION_JOBS_H_
#define TXL_SERVER_JOBS_SESSION_JOBS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/durability/recovery.h"
#include "server/jobs/job.h"
#include "server/sessions/session_export.h"

namespace txl {

// A one-shot kind's answer: `value` when the job succeeded, else its error.
template <typename T>
Job::Answer AnswerWith(std::function<void(absl::StatusOr<T>)> done, T value) {
  if (!done) return nullptr;
  return [done = std::move(done), value = std::move(value)](absl::Status status, int64_t) mutable {
    if (status.ok()) {
      done(std::move(value));
    } else {
      done(std::move(status));
    }
  };
}
// Its status alone.
Job::Answer AnswerStatus(JobDone done);

// The kinds that make a session (Fork, Import) answer with it.
class MakeSessionJob : public Job {
 public:
  explicit MakeSessionJob(SessionMade done) : done_(std::move(done)) {}
  Answer TakeAnswer() override { return AnswerWith(std::move(done_), std::move(made_)); }
  bool acks_durably() const override { return true; }

 protected:
  // A session that is not journaled: released and answered at the end.
  void Made(SessionInfo info) { made_ = std::move(info); }
  // A journaled one: answered once the state store has it (JobRunner::RecordNewSession).
  void Record(JobRunner& runner, const SessionInfo& info, SessionLease lease, std::string snapshot);

 private:
  SessionMade done_;
  SessionInfo made_;
};

// A copy of the session (state, pending token, history) as a new session of
// the same owner, whose id keeps the source's routing prefix. A fork of a
// journaled session is journaled too.
// `position` (0: the source's own) branches from an earlier point (state_at.h).
class ForkJob final : public MakeSessionJob {
 public:
  ForkJob(SessionLease source, absl::Duration idle_ttl, std::map<std::string, std::string> labels, int64_t position,
          SessionMade done);
  void Run(JobRunner& runner) override;

 private:
  const absl::Duration idle_ttl_;
  const std::map<std::string, std::string> labels_;
  const int64_t position_;
};

// Takes the session back to `position` of its history (state_at.h). A
// journaled session stays busy until the state store has the rewind; if it
// cannot be written, the session is as it was and the client is told.
class RewindJob final : public Job {
 public:
  RewindJob(SessionLease lease, int64_t position, JobDone done);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }
  Answer TakeAnswer() override { return AnswerStatus(std::move(done_)); }

 private:
  const int64_t position_;
  JobDone done_;
};

// Rebuilds the session on another model version `to` by replaying its
// history's last n_layer x (mem_len - 1) tokens from an empty state: the
// session then answers as `to` would have, had it read those tokens (which
// changes its answers). Journaled: the new snapshot replaces the old one
// before the answer. OUT_OF_RANGE when the kept history is shorter.
class MigrateJob final : public Job {
 public:
  MigrateJob(SessionLease lease, std::shared_ptr<ServedModel> to, JobDone done);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }
  Answer TakeAnswer() override { return AnswerStatus(std::move(done_)); }

 private:
  const std::shared_ptr<ServedModel> to_;
  JobDone done_;
};

// The session's state as SessionExport bytes.
class ExportJob final : public Job {
 public:
  ExportJob(SessionLease lease, ExportDone done);
  void Run(JobRunner& runner) override;
  Answer TakeAnswer() override { return AnswerWith(std::move(done_), std::move(bytes_)); }

 private:
  ExportDone done_;
  std::string bytes_;
};

// A new session from a decoded export whose fingerprint the caller checked.
struct ImportSpec {
  std::string owner;
  std::shared_ptr<ServedModel> model;  // the version the image is of (its fingerprint checked)
  SessionExport image;
  absl::Duration idle_ttl;
  std::map<std::string, std::string> labels;
  std::string id;           // as SessionTable::Create
  int64_t max_mem_len = 0;  // a larger window in the image: INVALID_ARGUMENT
};

class ImportJob final : public MakeSessionJob {
 public:
  ImportJob(ImportSpec spec, SessionMade done);
  void Run(JobRunner& runner) override;

 private:
  absl::Status Import(JobRunner& runner);
  ImportSpec spec_;
};

// Claims a session the state store holds for no live replica and adds it
// here, out of device memory, for `caller`, its owner.
class AdoptJob final : public Job {
 public:
  AdoptJob(std::string caller, std::string id, RecordModel model_of, JobDone done);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }
  Answer TakeAnswer() override { return AnswerStatus(std::move(done_)); }

 private:
  const std::string caller_, id_;
  const RecordModel model_of_;
  JobDone done_;
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_SESSION_JOBS_H_
