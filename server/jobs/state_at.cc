#include "server/jobs/state_at.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/status_macros.h"

namespace txl {
namespace {

// The session as it was at `position` (no image: an empty state there,
// NewSessionAt), that history replay can start from.
struct Anchor {
  int64_t position = -1;  // -1: none
  std::shared_ptr<const std::string> image;
  std::vector<int> pending;
  bool checkpoint = false;
};

// The session's history and snapshot as the state store holds them: the
// whole log, where the in-memory history was cut at --session_history_tokens.
struct StoredHistory {
  TokenHistory history;
  Anchor snapshot;
};

absl::StatusOr<StoredHistory> ReadStore(JobRunner& runner, const SessionLease& lease) {
  (void)runner.journal()->Flush();
  ASSIGN_OR_RETURN(JournalRecord record, runner.journal()->Load(lease.id));
  if (record.position() != lease.position())
    return absl::FailedPreconditionError("the state store is behind the session");
  StoredHistory out;
  out.history = TokenHistory(record.history_start(), record.earlier);
  out.history.Append(record.tail, 0);
  out.snapshot.position = record.image.position;
  out.snapshot.pending = record.image.pending;
  if (!record.image.state.empty())
    out.snapshot.image = std::make_shared<const std::string>(std::move(record.image.state));
  return out;
}

// The best anchor for `position` among `images` and an empty state that
// starts `field` (the receptive field) tokens before the last one fed
// (bounded replay: it needs only those tokens of the history), and the
// earliest position any of them reaches.
Anchor Pick(const TokenHistory& history, const std::vector<Anchor>& images, int64_t position, int64_t field,
            int64_t* earliest) {
  Anchor best;
  // The history's last token stays pending: the tokens fed end at position - 1.
  const int64_t from = std::max<int64_t>(0, position - 1 - field);
  if (history.start() <= from) best.position = from;
  *earliest = std::min(*earliest, history.start() == 0 ? 0 : history.start() + field + 1);
  for (const Anchor& a : images) {
    const bool reaches = a.position == position || history.Covers(a.position, position);
    if (a.position >= history.start()) *earliest = std::min(*earliest, a.position);
    if (reaches && a.position <= position && a.position > best.position) best = a;
  }
  return best;
}

}  // namespace

absl::StatusOr<StateAt> RebuildAt(JobRunner& runner, const SessionLease& lease, int64_t position) {
  const SessionState& current = *lease.state;
  const int64_t now = lease.position();
  if (position < 0 || position > now) {
    return absl::InvalidArgumentError(
        absl::StrCat("position: must be in [0, ", now, "] (the session's position), got ", position));
  }
  StateAt out;
  out.served = "current";
  if (position == now) {  // the state as it is
    ASSIGN_OR_RETURN(out.state, current.Clone());
    out.pending = lease.pending;
    out.history = lease.history;
    return out;
  }
  // Below it, even by just the pending token, the state is rebuilt: a
  // session's last history token is always its pending one (docs/SESSIONS.md, "Rewind").

  std::vector<Anchor> images;
  for (const TurnCheckpoint& c : runner.table()->checkpoints().Of(lease.id))
    images.push_back({c.position, c.image, c.pending, true});
  int64_t earliest = now;
  const int64_t field = JobRunner::EngineOf(lease).ReceptiveField(current.mem_len());
  const TokenHistory* history = &lease.history;
  Anchor anchor = Pick(*history, images, position, field, &earliest);
  StoredHistory stored;
  if (anchor.position < 0 && runner.journaled_lease(lease)) {
    // Past what memory keeps: the state store has the whole history.
    if (auto s = ReadStore(runner, lease); s.ok()) {
      stored = *std::move(s);
      history = &stored.history;
      images.push_back(stored.snapshot);
      anchor = Pick(*history, images, position, field, &earliest);
    }
  }
  if (anchor.position < 0) {
    std::string exact;  // checkpoints older than the kept history: reachable only exactly
    for (const Anchor& a : images) {
      if (a.position < history->start()) absl::StrAppend(&exact, exact.empty() ? "" : ", ", a.position);
    }
    return absl::OutOfRangeError(
        absl::StrCat("position ", position, " of session ", EchoId(lease.id),
                     " is no longer reachable: its history is kept from position ", history->start(),
                     " and the earliest position it can go back to is ", earliest,
                     exact.empty() ? "" : absl::StrCat(" (and exactly to its checkpoints at ", exact, ")"),
                     "; --session_history_tokens, --checkpoint_budget, or a state store keep more"));
  }
  // The anchor's pending tokens, then the history up to the position; the last stays pending.
  std::vector<int> tokens = anchor.pending;
  const std::vector<int> more = history->Slice(anchor.position, position);
  tokens.insert(tokens.end(), more.begin(), more.end());
  IdleSession idle;
  if (anchor.image) idle.state = *anchor.image;
  idle.mem_len = current.mem_len();
  idle.start = anchor.position - static_cast<int64_t>(anchor.pending.size());
  if (!tokens.empty()) {
    out.pending = {tokens.back()};
    tokens.pop_back();
  }
  idle.feed = std::move(tokens);
  ASSIGN_OR_RETURN(out.state,
                   runner.Rebuild(JobRunner::EngineOf(lease), idle, JobRunner::RebuildFor::kBeside, &out.replayed));
  if (anchor.checkpoint) runner.table()->checkpoints().Touch(lease.id, anchor.position);
  out.served = anchor.image && out.replayed == 0 ? "checkpoint" : "replay";
  out.history = history->Prefix(position);
  if (history == &stored.history) {  // keep what memory would have kept
    const int64_t keep = runner.table()->config().history_tokens;
    const int64_t from = keep > 0 ? std::max(out.history.start(), out.history.end() - keep) : out.history.start();
    out.history = TokenHistory(from, out.history.Slice(from, out.history.end()));
  }
  return out;
}

}  // namespace txl
