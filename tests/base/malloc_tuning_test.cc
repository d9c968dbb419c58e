// TuneMalloc changes the whole process's allocator, so it has a test binary
// of its own.
#include "base/malloc_tuning.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

// The sanitizers bring allocators of their own, which mallopt does not reach.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TXL_OWN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TXL_OWN_ALLOCATOR 1
#endif
#endif

namespace txl {
namespace {

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Page faults taken while a block of `bytes` is allocated, written, freed.
long FaultsOfOneBlock(size_t bytes) {
  const long before = MinorFaults();
  char* p = static_cast<char*>(std::malloc(bytes));
  std::memset(p, 1, bytes);
  asm volatile("" : : "r"(p) : "memory");  // the writes happen: not elided before the free
  std::free(p);
  return MinorFaults() - before;
}

TEST(MallocTuningTest, RefusesNegativeSettings) {
  EXPECT_EQ(TuneMalloc({-1, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TuneMalloc({1, -1}).code(), absl::StatusCode::kInvalidArgument);
}

// The point of keep_bytes: a block freed and asked for again (a prefill's
// activations, pass after pass) is reused without faulting its pages in
// anew. Under glibc's defaults the second block of 24 MB is still mapped
// fresh (the first was mmapped, and only its free raises the thresholds).
TEST(MallocTuningTest, AFreedBlockIsReusedWithoutFaults) {
#ifdef TXL_OWN_ALLOCATOR
  GTEST_SKIP() << "a sanitizer's allocator: glibc's settings do not apply";
#endif
  ASSERT_TRUE(TuneMalloc({1, int64_t{256} << 20}).ok());
  const size_t bytes = size_t{24} << 20;
  const long pages = static_cast<long>(bytes / 4096);
  EXPECT_GT(FaultsOfOneBlock(bytes), pages / 2);  // the first time, every page
  EXPECT_LT(FaultsOfOneBlock(bytes), pages / 10);
  EXPECT_LT(FaultsOfOneBlock(bytes), pages / 10);
}

}  // namespace
}  // namespace txl
