#include "server/engine/version_policy.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace txl {

absl::StatusOr<VersionPolicy> ParseVersionPolicy(absl::string_view text) {
  VersionPolicy p;
  if (text == "all") {
    p.latest = 0;
    return p;
  }
  if (text == "latest") return p;
  absl::string_view n = text;
  if (absl::ConsumePrefix(&n, "latest:") && absl::SimpleAtoi(n, &p.latest) && p.latest >= 1 && p.latest <= 1000) {
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("version policy \"", text, "\": want latest, latest:N (N from 1 to 1000) or all"));
}

std::string VersionPolicyName(const VersionPolicy& policy) {
  return policy.latest == 0 ? "all" : absl::StrCat("latest:", policy.latest);
}

std::vector<int64_t> WantedVersions(const VersionPolicy& policy, const std::vector<RepositoryVersion>& versions) {
  std::vector<int64_t> out;
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (!it->complete) continue;
    if (policy.latest > 0 && static_cast<int64_t>(out.size()) == policy.latest) break;
    out.insert(out.begin(), it->version);
  }
  return out;
}

}  // namespace txl
