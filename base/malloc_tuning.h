// glibc malloc's process-wide settings, for the mains (txl-server, the
// benchmarks): how many arenas, and how much freed memory it keeps for reuse.
// Set before any thread starts.
#ifndef TXL_BASE_MALLOC_TUNING_H_
#define TXL_BASE_MALLOC_TUNING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace txl {

struct MallocTuning {
  // M_ARENA_MAX; 0 keeps glibc's default (8 per core).
  int arenas = 1;
  // M_TRIM_THRESHOLD: freed memory at the top of a heap that glibc keeps
  // rather than returning; blocks up to kHeapBlockMax then come from the heap,
  // not from mmap (M_MMAP_THRESHOLD). 0 keeps glibc's defaults (128 KiB,
  // adjusted as blocks are freed), under which a long prefill's activations
  // were mapped, faulted in and unmapped on every pass.
  int64_t keep_bytes = int64_t{256} << 20;
};

// The largest M_MMAP_THRESHOLD glibc takes on 64-bit (half its 64 MiB heaps).
inline constexpr int64_t kHeapBlockMax = int64_t{32} << 20;

// Applies `tuning`: InvalidArgument for a negative field, Internal where
// glibc refuses a setting.
absl::Status TuneMalloc(const MallocTuning& tuning);

// Returns the freed memory glibc keeps to the system (malloc_trim): after
// the model loads, so its temporaries do not stay resident.
void ReleaseFreedMemory();

}  // namespace txl

#endif  // TXL_BASE_MALLOC_TUNING_H_
