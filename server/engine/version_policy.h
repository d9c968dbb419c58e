// Which versions of a model in a repository are served (--version_policy):
// "latest" (the newest), "latest:N" (the N newest) or "all". Only complete
// versions (model.pt present) count; one that failed to load still takes its
// place in "latest:N", so that a damaged newest version does not silently
// bring back an older one the operator meant to retire.
#ifndef TXL_SERVER_ENGINE_VERSION_POLICY_H_
#define TXL_SERVER_ENGINE_VERSION_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/model_repository_layout.h"

namespace txl {

struct VersionPolicy {
  int64_t latest = 1;  // 0: all
};

// INVALID_ARGUMENT naming the text and the accepted forms.
absl::StatusOr<VersionPolicy> ParseVersionPolicy(absl::string_view text);
std::string VersionPolicyName(const VersionPolicy& policy);

// The versions `policy` serves out of `versions` (oldest first, as
// ListVersions gives them), oldest first.
std::vector<int64_t> WantedVersions(const VersionPolicy& policy, const std::vector<RepositoryVersion>& versions);

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_VERSION_POLICY_H_
