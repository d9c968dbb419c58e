#include "base/malloc_tuning.h"

#include <malloc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace txl {

absl::Status TuneMalloc(const MallocTuning& tuning) {
  if (tuning.arenas < 0) return absl::InvalidArgumentError("malloc arenas must be >= 0");
  if (tuning.keep_bytes < 0) return absl::InvalidArgumentError("malloc keep bytes must be >= 0");
  if (tuning.arenas > 0 && mallopt(M_ARENA_MAX, tuning.arenas) != 1) {
    return absl::InternalError(absl::StrCat("mallopt(M_ARENA_MAX, ", tuning.arenas, ") failed"));
  }
  if (tuning.keep_bytes == 0) return absl::OkStatus();
  // Both or neither: setting one turns off glibc's adjustment of the other.
  const int64_t keep = std::min<int64_t>(tuning.keep_bytes, int64_t{1} << 30);
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapBlockMax)) != 1) {
    return absl::InternalError(absl::StrCat("mallopt(M_MMAP_THRESHOLD, ", kHeapBlockMax, ") failed"));
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(keep)) != 1) {
    return absl::InternalError(absl::StrCat("mallopt(M_TRIM_THRESHOLD, ", keep, ") failed"));
  }
  return absl::OkStatus();
}

void ReleaseFreedMemory() { malloc_trim(0); }

}  // namespace txl
