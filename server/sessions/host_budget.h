// The default session memory budget on a CPU (--session_memory_budget=-1):
// what the host (or the process's control group) has available once the
// model is loaded, less headroom for a step's work and less the other
// budgets that live in the same memory (turn checkpoints, the state cache,
// offloaded sessions, the rewind histories), so that weights, sessions and
// caches together stay within the machine. A host that leaves less than one
// session's full window stops start-up with an error naming the flags.
#ifndef TXL_SERVER_SESSIONS_HOST_BUDGET_H_
#define TXL_SERVER_SESSIONS_HOST_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/host_memory.h"
#include "server/sessions/session_table.h"

namespace txl {

struct HostBudgetConfig {
  HostMemory memory;            // read once the weights are loaded
  int64_t headroom = 0;         // --host_headroom; 0: 10% of memory.total_bytes
  int64_t checkpoints = 0;      // --checkpoint_budget
  int64_t state_cache = 0;      // --state_cache_budget
  int64_t offload = 0;          // --host_memory_budget
  int64_t history = 0;          // --max_sessions x --session_history_tokens x 4 bytes
  int64_t later_versions = 0;   // weights a repository may load later (--model_memory_budget)
  int64_t window_bytes = 0;     // one session's full window at the default mem_len
  int64_t default_mem_len = 0;  // for the messages
};

// The other budgets as `table` sets them (its memory_budget_bytes aside), and
// the window at its default mem_len of `window_bytes`.
HostBudgetConfig HostBudgetOf(const SessionTableConfig& table, const HostMemory& memory, int64_t headroom,
                              int64_t window_bytes, int64_t default_mem_len);

// `headroom`, or 0's default.
int64_t HostHeadroom(const HostBudgetConfig& c);

// available - headroom - the other budgets, or FAILED_PRECONDITION, with
// every figure, when that holds less than one window.
absl::StatusOr<int64_t> DefaultHostBudget(const HostBudgetConfig& c);

// "A bytes available (LIMITED_BY) less H headroom, C checkpoints, ...": the
// start-up log's account of the figure.
std::string DescribeHostBudget(const HostBudgetConfig& c);

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_HOST_BUDGET_H_
