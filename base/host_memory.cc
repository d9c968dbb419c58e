#include "base/host_memory.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/read_file.h"

namespace txl {

namespace {

// A v1 group without a limit reads 0x7FFFFFFFFFFFF000 (page-rounded INT64_MAX).
constexpr int64_t kNoLimit = int64_t{1} << 60;

// The number in a file of one number ("max", absent or unreadable: -1).
int64_t ReadNumber(const std::string& path) {
  auto text = ReadFile(path);
  int64_t value = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return -1;
  return value;
}

// The value of `key` in a "key value" file such as memory.stat (absent: 0).
int64_t ReadStat(const std::string& path, absl::string_view key) {
  auto text = ReadFile(path);
  if (!text.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (parts.size() == 2 && parts[0] == key && absl::SimpleAtoi(parts[1], &value)) return value;
  }
  return 0;
}

// A control-group hierarchy that holds the memory controller: its mount
// directory, the process's group in it, and its files' names.
struct Hierarchy {
  std::string mount, group, limit, usage, inactive_file;
};

std::vector<Hierarchy> MemoryHierarchies(const HostMemorySources& s) {
  std::vector<Hierarchy> out;
  auto text = ReadFile(s.proc + "/self/cgroup");
  if (!text.ok()) return out;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      out.push_back({s.cgroup, f[2], "memory.max", "memory.current", "inactive_file"});
    } else {
      std::vector<absl::string_view> controllers = absl::StrSplit(f[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "memory") != controllers.end()) {
        out.push_back(
            {s.cgroup + "/memory", f[2], "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"});
      }
    }
  }
  return out;
}

// Narrows `m` by every limited group from the process's own up to the root.
void ApplyLimits(const Hierarchy& h, HostMemory* m) {
  std::string group = h.group;
  while (true) {
    const std::string dir = group == "/" || group.empty() ? h.mount : h.mount + group;
    const int64_t limit = ReadNumber(dir + "/" + h.limit);
    if (limit > 0 && limit < kNoLimit) {
      // Usage counts the page cache; what the kernel can drop without
      // pressure (inactive file pages) is not taken.
      const int64_t usage =
          std::max<int64_t>(0, ReadNumber(dir + "/" + h.usage)) - ReadStat(dir + "/memory.stat", h.inactive_file);
      const int64_t available = std::max<int64_t>(0, limit - std::max<int64_t>(0, usage));
      if (limit < m->total_bytes) m->total_bytes = limit;
      if (available < m->available_bytes) {
        m->available_bytes = available;
        m->limited_by = dir;
      }
    }
    if (group == "/" || group.empty()) return;
    const size_t slash = group.find_last_of('/');
    group = slash == 0 || slash == std::string::npos ? "/" : group.substr(0, slash);
  }
}

}  // namespace

absl::StatusOr<HostMemory> ReadHostMemory(const HostMemorySources& sources) {
  const std::string meminfo = sources.proc + "/meminfo";
  auto text = ReadFile(meminfo);
  if (!text.ok()) return text.status();
  HostMemory m;
  m.total_bytes = m.available_bytes = -1;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &kib)) continue;
    if (parts[0] == "MemTotal:") m.total_bytes = kib * 1024;
    if (parts[0] == "MemAvailable:") m.available_bytes = kib * 1024;
  }
  if (m.total_bytes < 0 || m.available_bytes < 0) {
    return absl::InternalError(absl::StrCat(meminfo, ": no MemTotal or MemAvailable line"));
  }
  m.limited_by = "host";
  for (const Hierarchy& h : MemoryHierarchies(sources)) ApplyLimits(h, &m);
  return m;
}

}  // namespace txl
