// The one-shot kinds: jobs that run once on the engine thread, between
// steps, because they touch session states (fork_job.cc, rewind_job.cc,
// export_job.cc, import_job.cc, adopt_job.cc).
#ifndef TXL_SERVER_JOBS_SESSION_JOBS_H_
#define TXL_SERVER_JOBS_SESSION_JOBS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "server/jobs/job.h"
#include "server/sessions/session_export.h"

namespace txl {

// A copy of the session (state, pending token, history) as a new session of
// the same owner, whose id keeps the source's routing prefix. A fork of a
// journaled session is journaled too.
// `position` (0: the source's own) branches from an earlier point (state_at.h).
class ForkJob final : public Job {
 public:
  ForkJob(SessionLease source, absl::Duration idle_ttl, std::map<std::string, std::string> labels, int64_t position,
          JobCallbacks callbacks);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }

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
  RewindJob(SessionLease lease, int64_t position, JobCallbacks callbacks);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }

 private:
  const int64_t position_;
};

// The session's state as SessionExport bytes (JobResult::exported).
class ExportJob final : public Job {
 public:
  ExportJob(SessionLease lease, JobCallbacks callbacks);
  void Run(JobRunner& runner) override;
};

// A new session from a decoded export whose fingerprint the caller checked.
struct ImportSpec {
  std::string owner;
  SessionExport image;
  absl::Duration idle_ttl;
  std::map<std::string, std::string> labels;
  std::string id;           // as SessionTable::Create
  int64_t max_mem_len = 0;  // a larger window in the image: INVALID_ARGUMENT
};

class ImportJob final : public Job {
 public:
  ImportJob(ImportSpec spec, JobCallbacks callbacks);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }

 private:
  absl::Status Import(JobRunner& runner);
  ImportSpec spec_;
};

// Claims a session the state store holds for no live replica and adds it
// here, out of device memory, for `caller`, its owner.
class AdoptJob final : public Job {
 public:
  AdoptJob(std::string caller, std::string id, JobCallbacks callbacks);
  void Run(JobRunner& runner) override;
  bool acks_durably() const override { return true; }

 private:
  const std::string caller_, id_;
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_SESSION_JOBS_H_
