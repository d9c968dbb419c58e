// RedisStateBackend: keys are Redis strings named PREFIX ":" key, on one
// connection (hiredis) shared under a mutex. Durability is the Redis
// server's (appendonly, appendfsync); the fsync policy does not apply.
#include <hiredis/hiredis.h>
#include <poll.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "server/durability/state_backend.h"
#include "server/durability/state_backend_impl.h"

namespace txl {
namespace state_backend_internal {
namespace {

// Atomic in Redis (scripts run alone). ARGV: "absent" or "equal", the
// expected value, the new value.
constexpr char kCompareAndSetScript[] = R"lua(
local current = redis.call('GET', KEYS[1])
if ARGV[1] == 'absent' then
  if current then return 0 end
elseif current ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
)lua";

// A guarded write (StateBackend::Write), atomic in Redis. KEYS: the keys it
// names. ARGV: the label, the number of guards and each as kind ("oneof",
// "absent", "len"), key index and its operands ("oneof": a count and the
// values; "len": the length), then the number of mutations and each as kind
// ("put", "append", "del"), key index and value (not for "del"). Returns 0
// when applied, else the 1-based index of the first guard that failed.
constexpr char kWriteScript[] = R"lua(
local a = 2
local n = tonumber(ARGV[a]); a = a + 1
for g = 1, n do
  local kind, key = ARGV[a], KEYS[tonumber(ARGV[a + 1])]; a = a + 2
  if kind == 'oneof' then
    local m, v, hit = tonumber(ARGV[a]), redis.call('GET', key), false
    for i = 1, m do if v == ARGV[a + i] then hit = true end end
    a = a + m + 1
    if not hit then return g end
  elseif kind == 'absent' then
    if redis.call('EXISTS', key) == 1 then return g end
  else
    if redis.call('STRLEN', key) ~= tonumber(ARGV[a]) then return g end
    a = a + 1
  end
end
n = tonumber(ARGV[a]); a = a + 1
for i = 1, n do
  local kind, key = ARGV[a], KEYS[tonumber(ARGV[a + 1])]; a = a + 2
  if kind == 'put' then redis.call('SET', key, ARGV[a]); a = a + 1
  elseif kind == 'append' then redis.call('APPEND', key, ARGV[a]); a = a + 1
  else redis.call('DEL', key) end
end
return 0
)lua";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

using Command = std::vector<std::string>;

// Whether resending a command whose reply was lost is harmless. APPEND and
// the compare-and-set script are not: the first send may have been applied.
enum class Retry { kSafe, kUnsafe };

std::string ReplyText(const redisReply* r) { return r->str == nullptr ? "" : std::string(r->str, r->len); }

// SCAN's MATCH is a glob: the prefix's own glob characters must match literally.
std::string EscapeGlob(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

absl::Status InvalidKey(const std::string& key) {
  return absl::InvalidArgumentError(absl::StrCat("invalid state key \"", key, "\""));
}

class RedisStateBackend : public StateBackend {
 public:
  RedisStateBackend(std::string host, int port, std::string prefix, absl::Duration timeout)
      : host_(std::move(host)),
        port_(port),
        address_(absl::StrCat(absl::StrContains(host_, ':') ? absl::StrCat("[", host_, "]") : host_, ":", port)),
        prefix_(std::move(prefix)),
        timeout_(timeout) {}

  std::string Describe() const override { return absl::StrCat("redis://", address_, "/", prefix_); }

  absl::Status Ping() {
    ASSIGN_OR_RETURN(std::vector<Reply> replies, Run({{"PING"}}, Retry::kSafe));
    const redisReply* r = replies[0].get();
    if (r->type != REDIS_REPLY_STATUS || ReplyText(r) != "PONG") {
      return absl::UnavailableError(absl::StrCat("redis ", address_, ": PING answered ", Unexpected(r)));
    }
    return absl::OkStatus();
  }

  absl::Status Put(const std::string& key, absl::string_view value) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    ASSIGN_OR_RETURN(std::vector<Reply> replies, Run({{"SET", Name(key), std::string(value)}}, Retry::kSafe));
    return Expect(replies[0].get(), REDIS_REPLY_STATUS, "SET", key);
  }

  bool AppliesLate() const override { return true; }

  absl::Status Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) override {
    outcomes->assign(writes.size(), kWriteNotApplied);
    std::vector<Command> commands;
    for (const StoreWrite& w : writes) {
      ASSIGN_OR_RETURN(Command c, WriteCommand(w));
      commands.push_back(std::move(c));
    }
    if (commands.empty()) return absl::OkStatus();
    // Pipelined: one round trip. Each script is atomic on its own.
    absl::StatusOr<std::vector<Reply>> replies = Run(commands, Retry::kUnsafe);
    if (!replies.ok()) {
      if (absl::IsUnknown(replies.status())) outcomes->assign(writes.size(), kWriteUnknown);
      return replies.status();
    }
    absl::Status first;  // the first write Redis refused
    for (size_t i = 0; i < writes.size(); ++i) {
      const redisReply* r = (*replies)[i].get();
      if (r->type == REDIS_REPLY_INTEGER) {
        (*outcomes)[i] = r->integer == 0 ? kWriteApplied : static_cast<int>(r->integer) - 1;
        continue;
      }
      // A script refused before it ran (OOM, a read-only replica) wrote
      // nothing; one that failed midway may have written part of itself.
      absl::Status refused = Failure(r, writes[i].label, writes[i].mutations.front().key);
      const bool before_running = absl::IsResourceExhausted(refused) || absl::IsUnavailable(refused);
      (*outcomes)[i] = before_running ? kWriteNotApplied : kWriteUnknown;
      if (!before_running) refused = absl::UnknownError(refused.message());
      if (first.ok()) first = refused;
    }
    return first;
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    ASSIGN_OR_RETURN(std::vector<Reply> replies, Run({{"GET", Name(key)}}, Retry::kSafe));
    const redisReply* r = replies[0].get();
    if (r->type == REDIS_REPLY_NIL) return absl::NotFoundError(absl::StrCat("state key \"", key, "\" not found"));
    RETURN_IF_ERROR(Expect(r, REDIS_REPLY_STRING, "GET", key));
    return ReplyText(r);
  }

  absl::Status Delete(const std::string& key) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    ASSIGN_OR_RETURN(std::vector<Reply> replies, Run({{"DEL", Name(key)}}, Retry::kSafe));
    return Expect(replies[0].get(), REDIS_REPLY_INTEGER, "DEL", key);
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override {
    const std::string pattern = absl::StrCat(EscapeGlob(Name(prefix)), "*");
    const size_t strip = prefix_.size() + 1;
    std::vector<std::string> keys;
    std::string cursor = "0";
    do {
      ASSIGN_OR_RETURN(std::vector<Reply> replies,
                       Run({{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}}, Retry::kSafe));
      const redisReply* r = replies[0].get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
          r->element[1]->type != REDIS_REPLY_ARRAY) {
        return Failure(r, "SCAN", prefix);
      }
      cursor = ReplyText(r->element[0]);
      const redisReply* batch = r->element[1];
      for (size_t i = 0; i < batch->elements; ++i) {
        if (batch->element[i]->type != REDIS_REPLY_STRING) continue;
        std::string key = ReplyText(batch->element[i]).substr(strip);
        if (IsValidStateKey(key) && ListIncludes(key, prefix)) keys.push_back(std::move(key));
      }
    } while (cursor != "0");
    // SCAN may return a key more than once (when the table is rehashed).
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }

  absl::StatusOr<bool> CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                     absl::string_view value) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    ASSIGN_OR_RETURN(std::vector<Reply> replies,
                     Run({{"EVAL", kCompareAndSetScript, "1", Name(key), expected.has_value() ? "equal" : "absent",
                           expected.value_or(""), std::string(value)}},
                         Retry::kUnsafe));
    const redisReply* r = replies[0].get();
    RETURN_IF_ERROR(Expect(r, REDIS_REPLY_INTEGER, "compare-and-set", key));
    return r->integer == 1;
  }

  absl::Status Quarantine(const std::string& key) override {
    if (!IsValidStateKey(key)) return InvalidKey(key);
    const std::string stamp = absl::StrCat(absl::ToUnixSeconds(absl::Now()));
    // RENAMENX: a second quarantine in the same second gets a suffix rather
    // than replacing the first one's bytes. Resending is safe: a lost
    // success makes the resend find no key, which is success too.
    for (int n = 0; n < 100; ++n) {
      const std::string target = absl::StrCat("quarantine/", key, ".", stamp, n == 0 ? "" : absl::StrCat("-", n));
      if (!IsValidStateKey(target)) return InvalidKey(target);  // only when the key is near the length limit
      ASSIGN_OR_RETURN(std::vector<Reply> replies, Run({{"RENAMENX", Name(key), Name(target)}}, Retry::kSafe));
      const redisReply* r = replies[0].get();
      if (r->type == REDIS_REPLY_ERROR && absl::StrContains(ReplyText(r), "no such key")) return absl::OkStatus();
      RETURN_IF_ERROR(Expect(r, REDIS_REPLY_INTEGER, "RENAMENX", key));
      if (r->integer == 1) return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat("state key \"", key, "\": too many quarantined copies this second"));
  }

 private:
  std::string Name(const std::string& key) const { return absl::StrCat(prefix_, ":", key); }

  // The EVAL of kWriteScript that makes `w`.
  absl::StatusOr<Command> WriteCommand(const StoreWrite& w) const {
    if (w.mutations.empty()) return absl::InvalidArgumentError("a state store write changes nothing");
    std::vector<std::string> keys;
    auto index = [&](const std::string& key) -> absl::StatusOr<std::string> {
      if (!IsValidStateKey(key)) return InvalidKey(key);
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) it = keys.insert(keys.end(), key);
      return absl::StrCat(it - keys.begin() + 1);
    };
    std::vector<std::string> argv = {w.label.empty() ? "write" : w.label, absl::StrCat(w.guards.size())};
    for (const StoreGuard& g : w.guards) {
      ASSIGN_OR_RETURN(std::string at, index(g.key));
      if (g.kind == StoreGuard::kOneOf) {
        argv.insert(argv.end(), {"oneof", at, absl::StrCat(g.values.size())});
        argv.insert(argv.end(), g.values.begin(), g.values.end());
      } else if (g.kind == StoreGuard::kAbsent) {
        argv.insert(argv.end(), {"absent", at});
      } else {
        argv.insert(argv.end(), {"len", at, absl::StrCat(g.length)});
      }
    }
    argv.push_back(absl::StrCat(w.mutations.size()));
    for (const StoreMutation& m : w.mutations) {
      ASSIGN_OR_RETURN(std::string at, index(m.key));
      if (m.kind == StoreMutation::kDelete) {
        argv.insert(argv.end(), {"del", at});
      } else {
        argv.insert(argv.end(), {m.kind == StoreMutation::kPut ? "put" : "append", at, m.value});
      }
    }
    Command c = {"EVAL", kWriteScript, absl::StrCat(keys.size())};
    for (const std::string& key : keys) c.push_back(Name(key));
    c.insert(c.end(), argv.begin(), argv.end());
    return c;
  }

  static std::string Unexpected(const redisReply* r) {
    switch (r->type) {
      case REDIS_REPLY_NIL: return "nil";
      case REDIS_REPLY_INTEGER: return absl::StrCat("integer ", r->integer);
      case REDIS_REPLY_ARRAY: return absl::StrCat("an array of ", r->elements);
      default: return absl::StrCat("\"", ReplyText(r), "\"");
    }
  }

  // An error reply (or one of the wrong type). The codes that say "try
  // again later" become UNAVAILABLE, like a lost connection.
  absl::Status Failure(const redisReply* r, absl::string_view op, const std::string& key) const {
    std::string message = absl::StrCat("redis ", address_, ": ", op, " \"", key, "\": ");
    if (r->type != REDIS_REPLY_ERROR)
      return absl::InternalError(absl::StrCat(message, "unexpected reply ", Unexpected(r)));
    const std::string text = ReplyText(r);
    absl::StrAppend(&message, text);
    if (absl::StartsWith(text, "OOM")) return absl::ResourceExhaustedError(message);
    for (const char* transient : {"LOADING", "READONLY", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN"}) {
      if (absl::StartsWith(text, transient)) return absl::UnavailableError(message);
    }
    return absl::InternalError(message);
  }

  absl::Status Expect(const redisReply* r, int type, absl::string_view op, const std::string& key) const {
    return r->type == type ? absl::OkStatus() : Failure(r, op, key);
  }

  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const timeval tv = absl::ToTimeval(timeout_);
    Context c(redisConnectWithTimeout(host_.c_str(), port_, tv));
    if (c == nullptr) return absl::UnavailableError(absl::StrCat("redis ", address_, ": cannot allocate a context"));
    if (c->err != 0) return absl::UnavailableError(absl::StrCat("redis ", address_, ": connect: ", c->errstr));
    // Without a command timeout a server that stops answering would hang every caller behind mu_.
    if (redisSetTimeout(c.get(), tv) != REDIS_OK || redisEnableKeepAlive(c.get()) != REDIS_OK) {
      return absl::UnavailableError(absl::StrCat("redis ", address_, ": connect: ", c->errstr));
    }
    ctx_ = std::move(c);
    return absl::OkStatus();
  }

  // Redis sends nothing unasked, so an idle connection that polls readable
  // was closed by the server (restart, idle timeout): reconnecting before
  // sending is what makes not resending kUnsafe commands cheap.
  bool PeerClosedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pollfd p{ctx_->fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Sends the commands pipelined and reads their replies (error replies
  // included; the caller judges them). After an I/O error reconnects and,
  // for kSafe commands, sends them once more.
  absl::StatusOr<std::vector<Reply>> Run(const std::vector<Command>& commands, Retry retry) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::string error;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (ctx_ == nullptr || ctx_->err != 0 || PeerClosedLocked()) {
        ctx_.reset();
        RETURN_IF_ERROR(ConnectLocked());
      }
      for (const Command& command : commands) {
        std::vector<const char*> argv;
        std::vector<size_t> lengths;
        for (const std::string& arg : command) {
          argv.push_back(arg.data());
          lengths.push_back(arg.size());
        }
        if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lengths.data()) !=
            REDIS_OK) {
          ctx_.reset();  // out of memory; the buffer may hold part of the pipeline
          return absl::ResourceExhaustedError(absl::StrCat("redis ", address_, ": cannot buffer a command"));
        }
      }
      std::vector<Reply> replies;
      for (size_t i = 0; i < commands.size(); ++i) {
        void* reply = nullptr;
        if (redisGetReply(ctx_.get(), &reply) != REDIS_OK) break;
        replies.emplace_back(static_cast<redisReply*>(reply));
      }
      if (replies.size() == commands.size()) return replies;
      error = ctx_->errstr;
      ctx_.reset();
      if (retry == Retry::kUnsafe) {
        return absl::UnknownError(absl::StrCat("redis ", address_, ": ", error, " (", commands.size(),
                                               " command(s) sent; some may have been applied)"));
      }
    }
    return absl::UnavailableError(absl::StrCat("redis ", address_, ": ", error));
  }

  const std::string host_;
  const int port_;
  const std::string address_;  // host:port, for messages
  const std::string prefix_;
  const absl::Duration timeout_;

  absl::Mutex mu_;
  Context ctx_ ABSL_GUARDED_BY(mu_);  // null until connected, and after an I/O error
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateBackend>> OpenRedisStateBackend(const std::string& host, int port,
                                                                    const std::string& prefix, absl::Duration timeout) {
  auto backend = std::make_unique<RedisStateBackend>(host, port, prefix, timeout);
  RETURN_IF_ERROR(backend->Ping());
  return backend;
}

}  // namespace state_backend_internal
}  // namespace txl
