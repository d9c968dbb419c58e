#include "server/durability/new_session.h"

#include <memory>

namespace txl {

void RecordNewSession(SessionJournal* journal, SessionTable* table, const SessionInfo& info, SessionLease lease,
                      std::string snapshot, std::function<void(absl::Status, const SessionInfo&)> done) {
  SessionMeta meta{info.id, info.owner, info.mem_len, info.idle_ttl, info.created, info.labels, info.model};
  // Its log starts with the history it inherits (a fork), so that it can be rewound past its start.
  const TokenHistory& history = lease.history;
  std::vector<int> inherited = history.Slice(history.start(), history.end());
  const int64_t history_start = history.start();
  auto held = std::make_shared<SessionLease>(std::move(lease));
  SessionInfo answer = info;
  answer.busy = false;  // as it is once released
  journal->RecordCreate(
      meta, std::move(snapshot),
      [table, held, done = std::move(done), answer](absl::Status written) {
        if (written.ok()) {
          table->Release(std::move(*held), absl::Now());
        } else {
          table->Discard(std::move(*held));
        }
        if (done) done(written, answer);
      },
      history_start, std::move(inherited));
}

}  // namespace txl
