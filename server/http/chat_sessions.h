// ChatSessions: which chat messages each session has already been fed, so
// that /v1/chat/completions with a session feeds only the new ones. OpenAI
// clients resend the whole conversation every call; the session holds its
// model memory, not the messages, so the gateway remembers, per session, a
// hash of the messages seen (the last one the assistant reply it produced)
// and the position after them. docs/HTTP.md states the rule; Plan applies it.
#ifndef TXL_SERVER_HTTP_CHAT_SESSIONS_H_
#define TXL_SERVER_HTTP_CHAT_SESSIONS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/http/chat_template.h"
#include "server/http/openai_json.h"

namespace txl {

class ChatSessions {
 public:
  explicit ChatSessions(size_t capacity = 1 << 16) : capacity_(capacity) {}
  // The text to feed a session at `position` for `messages`; 409 when the
  // session's history and the messages disagree, 400 when nothing is new.
  absl::StatusOr<std::string> Plan(const std::string& session, int64_t position,
                                   const std::vector<ChatMessage>& messages, const ChatTemplate& t,
                                   HttpError* error) const;
  // After a chat completion: `messages` and the reply are now seen, at `position`.
  void Record(const std::string& session, const std::vector<ChatMessage>& messages, const std::string& reply,
              int64_t position);
  void Copy(const std::string& from, const std::string& to);  // a fork sees what its source saw
  void Forget(const std::string& session);

 private:
  struct Seen {
    uint64_t hash = 0;  // of the messages seen, in order
    size_t count = 0;
    int64_t position = 0;
  };
  void Put(const std::string& session, Seen seen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;  // sessions remembered; the oldest record goes first
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Seen> seen_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_HTTP_CHAT_SESSIONS_H_
