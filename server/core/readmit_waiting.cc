#include "server/core/readmit_waiting.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "server/engine/model_source.h"
#include "server/engine/served_model.h"

namespace txl {

namespace {

using Waiting = SessionJournal::WaitingSession;

// Puts `w` back to wait after a failed try, tried again after the backoff.
void WaitAgain(SessionJournal* journal, Waiting w, const absl::Status& why) {
  TXL_LOG(WARNING) << "session " << w.id << " stays waiting for its version " << w.model << ": " << why.message();
  w.retry_at = absl::Now() + kWaitingRetryBackoff;
  journal->Wait(std::move(w));
}

// Whether the version a session waits for is gone for good, as a restart
// would find it: its file removed, or its record names none.
bool GoneForGood(const absl::Status& kept) { return absl::IsNotFound(kept) || absl::IsInvalidArgument(kept); }

}  // namespace

WaitingReadmitter::WaitingReadmitter(SessionJournal* journal, ModelRepository* repository, Scheduler* scheduler,
                                     std::function<void()> wake)
    : journal_(journal), repository_(repository), scheduler_(scheduler), wake_(std::move(wake)) {}

Readmitted WaitingReadmitter::Run() {
  Readmitted r;
  const absl::Time now = absl::Now();
  std::map<std::string, std::vector<Waiting>> by_version;
  for (Waiting& w : journal_->Waiters()) {
    if (w.retry_at > now) {
      r.again = std::min(r.again, w.retry_at - now);
    } else {
      by_version[w.model].push_back(std::move(w));
    }
  }
  for (auto it = refused_at_.begin(); it != refused_at_.end();) {  // forget what nobody waits for
    it = by_version.count(it->first) ? std::next(it) : refused_at_.erase(it);
  }
  if (by_version.empty()) return r;
  // An adoption writes its claim: with the store failing, loading a version for it is for nothing.
  if (!journal_->Writable().ok()) {
    r.again = std::min(r.again, kWaitingRetryBackoff);
    return r;
  }
  for (auto& [model, sessions] : by_version) {
    const absl::StatusOr<std::shared_ptr<ServedModel>> kept = Kept(model);
    if (!kept.ok() && !GoneForGood(kept.status())) {
      if (!absl::IsResourceExhausted(kept.status()) && !absl::IsCancelled(kept.status())) {
        for (const Waiting& listed : sessions) {  // a load that failed: tried again after the backoff
          if (std::optional<Waiting> w = journal_->EndWait(listed.id, listed.owner))
            WaitAgain(journal_, *std::move(w), kept.status());
        }
        r.again = std::min(r.again, kWaitingRetryBackoff);
      }
      continue;  // no room yet, or the model unloaded: they wait
    }
    for (const Waiting& listed : sessions) {
      std::optional<Waiting> w = journal_->EndWait(listed.id, listed.owner);
      if (!w) continue;  // adopted, deleted, expired or taken over meanwhile
      const std::shared_ptr<ServedModel> version = kept.ok() ? *kept : nullptr;
      if (version == nullptr || version->engine()->fingerprint() != w->fingerprint) {
        TXL_LOG(WARNING) << "session " << w->id << " not recovered: its version " << model
                         << (version == nullptr
                                 ? absl::StrCat(" is gone: ", kept.status().message())
                                 : absl::StrCat(" now has fingerprint ", version->engine()->fingerprint(),
                                                ", the session's was ", w->fingerprint));
        journal_->RecordRelease(w->id);  // a replica that serves its version may adopt it
        continue;
      }
      // The version is held by the job until the session is bound to it.
      const RecordModel on_it = [version](const JournalRecord&) -> absl::StatusOr<std::shared_ptr<ServedModel>> {
        return version;
      };
      auto adopted = [journal = journal_, wake = wake_, w = *w](absl::Status s) {
        if (absl::IsUnavailable(s) || absl::IsResourceExhausted(s)) {
          WaitAgain(journal, w, s);  // the store, or the scheduler: tried again after the backoff
          if (wake) wake();          // so that the readmitter runs again and schedules that try
        } else if (!s.ok()) {
          TXL_LOG(WARNING) << "session " << w.id << " not recovered: " << s.message();
        }
      };
      auto job = scheduler_->SubmitAdopt(w->owner, w->id, on_it, adopted);
      if (job.ok()) {
        ++r.submitted;
      } else {
        WaitAgain(journal_, *std::move(w), job.status());
        r.again = std::min(r.again, kWaitingRetryBackoff);
      }
    }
  }
  return r;
}

absl::StatusOr<std::shared_ptr<ServedModel>> WaitingReadmitter::Kept(const std::string& model) {
  absl::StatusOr<ModelRef> ref = ParseModelRef(model);
  if (!ref.ok()) return ref.status();
  if (ref->name.empty() || ref->version == 0) {
    return absl::InvalidArgumentError(absl::StrCat("its record names no version (\"", model, "\")"));
  }
  // Unloaded by an operator: not loaded again behind their back (Load lifts it).
  if (repository_->Unloaded(ref->name)) return absl::CancelledError("the model is unloaded");
  if (auto refused = refused_at_.find(model); refused != refused_at_.end()) {
    // Refused for the budget: room is made only by freeing (on this thread, which then runs again).
    if (repository_->HeldBytes() >= refused->second) return absl::ResourceExhaustedError("no room yet");
  }
  absl::StatusOr<std::shared_ptr<ServedVersion>> kept = repository_->Keep(ref->name, ref->version);
  if (absl::IsResourceExhausted(kept.status())) {
    refused_at_[model] = repository_->HeldBytes();  // read now: nothing is freed but on this thread
    return kept.status();
  }
  refused_at_.erase(model);
  if (!kept.ok()) return kept.status();
  return std::static_pointer_cast<ServedModel>(*std::move(kept));
}

}  // namespace txl
