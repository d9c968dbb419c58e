// Private to the StateBackend implementations (state_backend*.cc): the
// factories OpenStateBackend dispatches to. Not part of the public API.
#ifndef TXL_SERVER_DURABILITY_STATE_BACKEND_IMPL_H_
#define TXL_SERVER_DURABILITY_STATE_BACKEND_IMPL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/durability/state_backend.h"

namespace txl {
namespace state_backend_internal {

// `root` is created if missing; UNAVAILABLE when that fails or it is not writable.
absl::StatusOr<std::unique_ptr<StateBackend>> OpenDirectoryStateBackend(const std::string& root, FsyncPolicy fsync,
                                                                        absl::Duration fsync_interval,
                                                                        const std::string& writer);

// UNAVAILABLE when the server does not answer a PING within `timeout`.
absl::StatusOr<std::unique_ptr<StateBackend>> OpenRedisStateBackend(const std::string& host, int port,
                                                                    const std::string& prefix, absl::Duration timeout);

// Test builds inject faults into the directory backend: `fault(point, key)`
// returning an errno makes that point fail. Points: "rename" (after a Put's
// rename: the value is in place but the call fails), "append" (after an
// append's bytes are written), "truncate" (the roll-back of a failed append,
// which then leaves the bytes). Null (the default): no faults.
void SetDirectoryFaultsForTest(std::function<int(absl::string_view point, const std::string& key)> fault);

// Whether a backend's List(prefix) reports `key`: it starts with the prefix,
// and quarantined keys only when the prefix asks for them explicitly.
bool ListIncludes(const std::string& key, const std::string& prefix);

}  // namespace state_backend_internal
}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_STATE_BACKEND_IMPL_H_
