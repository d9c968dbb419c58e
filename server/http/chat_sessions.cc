#include "server/http/chat_sessions.h"

#include <functional>

#include "absl/strings/str_cat.h"

namespace txl {
namespace {

uint64_t HashMessages(const std::vector<ChatMessage>& messages, size_t count) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < count; ++i) {
    // Lengths first, so that no two different lists join to the same text.
    const std::string key = absl::StrCat(messages[i].role.size(), ":", messages[i].role, messages[i].content.size(),
                                         ":", messages[i].content);
    h = (h ^ std::hash<std::string>()(key)) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<std::string> ChatSessions::Plan(const std::string& session, int64_t position,
                                               const std::vector<ChatMessage>& messages, const ChatTemplate& t,
                                               HttpError* error) const {
  auto fail = [&](int status, std::string message) {
    *error = HttpError{status, std::move(message), "messages", status == 409 ? "conflict" : "invalid_argument"};
    return absl::FailedPreconditionError(error->message);
  };
  size_t first = 0;         // the first message not yet fed
  bool reply_open = false;  // the session ends in an assistant reply whose suffix is not fed yet
  Seen seen;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = seen_.find(session); it != seen_.end()) {
      seen = it->second;
      known = true;
    }
  }
  if (known) {
    if (position != seen.position) {
      return fail(409, absl::StrCat("the session is at position ", position, ", not ", seen.position,
                                    " where its last chat completion left it: another call changed it; fork or "
                                    "create a session for a new conversation"));
    }
    if (messages.size() < seen.count || HashMessages(messages, seen.count) != seen.hash) {
      return fail(409, absl::StrCat("messages[0..", seen.count,
                                    ") differ from the conversation this session has seen (edited or reordered "
                                    "history); fork or create a session for it"));
    }
    first = seen.count;
    reply_open = true;
  } else if (position > 0) {
    // Not remembered (a restart, or a session fed by other calls): whatever
    // came up to the last assistant reply is taken as seen.
    size_t last = messages.size();
    for (size_t i = messages.size(); i-- > 0;) {
      if (messages[i].role == "assistant") {
        last = i;
        break;
      }
    }
    if (last == messages.size()) {
      return fail(409, absl::StrCat("the session already holds ", position,
                                    " tokens and these messages hold no assistant reply to continue from"));
    }
    first = last + 1;
    reply_open = true;
  }
  if (first >= messages.size()) return fail(400, "no new messages: the session has seen every message given");
  std::string feed = reply_open ? t.AssistantSuffix() : "";
  for (size_t i = first; i < messages.size(); ++i) feed += t.Render(messages[i]);
  return feed + t.generation_prompt;
}

void ChatSessions::Record(const std::string& session, const std::vector<ChatMessage>& messages,
                          const std::string& reply, int64_t position) {
  std::vector<ChatMessage> all = messages;
  all.push_back({"assistant", reply});
  absl::MutexLock lock(&mu_);
  Put(session, {HashMessages(all, all.size()), all.size(), position});
}

void ChatSessions::Copy(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  auto it = seen_.find(from);
  if (it != seen_.end()) Put(to, it->second);
}

void ChatSessions::Forget(const std::string& session) {
  absl::MutexLock lock(&mu_);
  seen_.erase(session);  // its entry in order_ goes when it comes up
}

void ChatSessions::Put(const std::string& session, Seen seen) {
  if (seen_.insert_or_assign(session, seen).second) order_.push_back(session);
  while (seen_.size() > capacity_ && !order_.empty()) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  // Forgotten ids leave stale entries behind: drop them once they dominate.
  if (order_.size() > 2 * capacity_) {
    std::deque<std::string> live;
    for (auto& id : order_) {
      if (seen_.contains(id)) live.push_back(std::move(id));
    }
    order_ = std::move(live);
  }
}

}  // namespace txl
