#include "server/sessions/host_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace txl {

HostBudgetConfig HostBudgetOf(const SessionTableConfig& table, const HostMemory& memory, int64_t headroom,
                              int64_t window_bytes, int64_t default_mem_len) {
  HostBudgetConfig c;
  c.memory = memory;
  c.headroom = headroom;
  c.checkpoints = table.checkpoints.budget_bytes;
  c.state_cache = table.state_cache.budget_bytes;
  c.offload = table.host_memory_budget_bytes;
  c.history = table.max_sessions * table.history_tokens * static_cast<int64_t>(sizeof(int));
  c.window_bytes = window_bytes;
  c.default_mem_len = default_mem_len;
  return c;
}

int64_t HostHeadroom(const HostBudgetConfig& c) { return c.headroom > 0 ? c.headroom : c.memory.total_bytes / 10; }

std::string DescribeHostBudget(const HostBudgetConfig& c) {
  return absl::StrCat(c.memory.available_bytes, " bytes available of ", c.memory.total_bytes, " (", c.memory.limited_by,
                      ") once the model is loaded, less ", HostHeadroom(c), " headroom (--host_headroom), ",
                      c.checkpoints, " turn checkpoints (--checkpoint_budget), ", c.state_cache,
                      " state cache (--state_cache_budget), ", c.offload, " offloaded sessions (--host_memory_budget)",
                      c.later_versions > 0
                          ? absl::StrCat(", ", c.later_versions, " model versions loaded later (--model_memory_budget)")
                          : "",
                      " and ", c.history, " rewind history (--max_sessions x --session_history_tokens x 4)");
}

absl::StatusOr<int64_t> DefaultHostBudget(const HostBudgetConfig& c) {
  const int64_t budget = c.memory.available_bytes - HostHeadroom(c) - c.checkpoints - c.state_cache - c.offload -
                         c.history - c.later_versions;
  if (budget < std::max<int64_t>(1, c.window_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no host memory left for sessions: ", DescribeHostBudget(c), " leaves ", budget,
        " bytes, less than one session's window (", c.window_bytes, " bytes at mem_len ", c.default_mem_len,
        "). Give --session_memory_budget (bytes; 0: no limit), or lower the budgets named"));
  }
  return budget;
}

}  // namespace txl
