// ParseFsyncPolicy, IsValidStateKey and OpenStateBackend's dispatch on the
// spec; the backends are state_backend_dir.cc and state_backend_redis.cc.
#include "server/durability/state_backend.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/durability/state_backend_impl.h"

namespace txl {
namespace {

// A segment becomes a file name (with a temp-file infix and a quarantine
// suffix added), so it stays well under NAME_MAX (255).
constexpr size_t kMaxSegmentChars = 200;
constexpr size_t kMaxKeyChars = 1024;
constexpr char kDefaultRedisPrefix[] = "txl";

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

absl::Status BadSpec(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("state store spec \"", spec, "\": ", why, " (want DIR, dir:DIR or redis://HOST:PORT[/PREFIX])"));
}

absl::StatusOr<std::unique_ptr<StateBackend>> OpenRedis(const StateBackendConfig& config) {
  const absl::string_view spec = config.spec;
  absl::string_view rest = spec.substr(sizeof("redis://") - 1);
  std::string prefix = kDefaultRedisPrefix;
  if (size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    if (slash + 1 < rest.size()) prefix = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
  }
  for (char c : prefix) {
    if (!IsKeyChar(c) && c != ':' && c != '/') return BadSpec(spec, "the prefix may hold only [A-Za-z0-9._:/-]");
  }
  std::string host;
  absl::string_view port_text;
  if (absl::StartsWith(rest, "[")) {  // [IPv6]:PORT
    size_t close = rest.find(']');
    if (close == absl::string_view::npos || rest.substr(close + 1, 1) != ":") return BadSpec(spec, "no port");
    host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return BadSpec(spec, "no port");
    host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  int port = 0;
  if (host.empty()) return BadSpec(spec, "no host");
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) return BadSpec(spec, "bad port");
  return state_backend_internal::OpenRedisStateBackend(host, port, prefix, config.redis_timeout);
}

}  // namespace

absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name) {
  if (name == "always") return FsyncPolicy::kAlways;
  if (name == "interval") return FsyncPolicy::kInterval;
  if (name == "never") return FsyncPolicy::kNever;
  return absl::InvalidArgumentError(absl::StrCat("fsync policy \"", name, "\": want always, interval or never"));
}

bool IsValidStateKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyChars || absl::StrContains(key, "..")) return false;
  for (absl::string_view segment : absl::StrSplit(key, '/')) {
    // Empty segments ("a//b", "/a", "a/") would alias other keys as paths;
    // dot-led names (".", ".lock", temp files) are the directory backend's
    // own; a trailing dot would make the quarantine name "<key>.<seconds>"
    // hold "..".
    if (segment.empty() || segment.size() > kMaxSegmentChars || segment.front() == '.' || segment.back() == '.') {
      return false;
    }
    for (char c : segment) {
      if (!IsKeyChar(c)) return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<StateBackend>> OpenStateBackend(const StateBackendConfig& config) {
  const std::string& spec = config.spec;
  if (absl::StartsWith(spec, "redis://")) return OpenRedis(config);
  if (config.fsync == FsyncPolicy::kInterval && config.fsync_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fsync interval must be positive, got ", absl::FormatDuration(config.fsync_interval)));
  }
  std::string dir = spec;
  if (absl::StartsWith(spec, "dir:")) {
    dir = spec.substr(4);
  } else if (absl::StrContains(spec, "://") || absl::StartsWith(spec, "redis:")) {
    return BadSpec(spec, "unknown scheme");
  }
  if (dir.empty()) return BadSpec(spec, "no directory");
  return state_backend_internal::OpenDirectoryStateBackend(dir, config.fsync, config.fsync_interval, config.writer);
}

namespace state_backend_internal {

bool ListIncludes(const std::string& key, const std::string& prefix) {
  return absl::StartsWith(key, prefix) &&
         (!absl::StartsWith(key, "quarantine/") || absl::StartsWith(prefix, "quarantine/"));
}

}  // namespace state_backend_internal
}  // namespace txl
