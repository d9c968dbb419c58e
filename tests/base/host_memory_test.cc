// ReadHostMemory: /proc/meminfo's figures, narrowed by the tightest memory
// control group (v1 or v2) from the process's own up to the root; fake
// /proc and /sys/fs/cgroup trees in a temporary directory.
#include "base/host_memory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "base/read_file.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

constexpr int64_t kKiB = 1024, kGiB = int64_t{1} << 30;

class HostMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/host_memory_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    s_.proc = root_ + "/proc";
    s_.cgroup = root_ + "/cgroup";
    for (const std::string& d : {root_, s_.proc, s_.proc + "/self", s_.cgroup}) mkdir(d.c_str(), 0755);
    // 24 GiB, 20 GiB available.
    Write(s_.proc + "/meminfo", "MemTotal:       25165824 kB\nMemFree:         1000 kB\nMemAvailable:   20971520 kB\n");
  }
  void Write(const std::string& path, const std::string& text) { ASSERT_TRUE(WriteFile(path, text).ok()) << path; }
  void Dirs(const std::string& path) {
    for (size_t i = 1; i <= path.size(); ++i) {
      if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
    }
  }
  std::string root_;
  HostMemorySources s_;
};

TEST_F(HostMemoryTest, WithoutControlGroupsItIsTheHosts) {
  auto m = ReadHostMemory(s_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, 24 * kGiB);
  EXPECT_EQ(m->available_bytes, 20 * kGiB);
  EXPECT_EQ(m->limited_by, "host");
}

TEST_F(HostMemoryTest, AV2LimitNarrowsBothFiguresAndIgnoresDroppableCache) {
  Write(s_.proc + "/self/cgroup", "0::/system.slice/txl.service\n");
  Dirs(s_.cgroup + "/system.slice/txl.service");
  Write(s_.cgroup + "/system.slice/txl.service/memory.max", "max\n");  // no limit at the leaf
  Write(s_.cgroup + "/system.slice/memory.max", absl::StrCat(4 * kGiB, "\n"));
  Write(s_.cgroup + "/system.slice/memory.current", absl::StrCat(3 * kGiB, "\n"));
  Write(s_.cgroup + "/system.slice/memory.stat", absl::StrCat("anon 1\ninactive_file ", kGiB, "\nactive_file 5\n"));
  auto m = ReadHostMemory(s_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, 4 * kGiB);
  EXPECT_EQ(m->available_bytes, 2 * kGiB);  // 4 - (3 - 1 of inactive file pages)
  EXPECT_EQ(m->limited_by, s_.cgroup + "/system.slice");
}

TEST_F(HostMemoryTest, AV1LimitCountsTooAndTheTightestLevelWins) {
  Write(s_.proc + "/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n");
  const std::string mem = s_.cgroup + "/memory";
  Dirs(mem + "/docker/abc");
  Write(mem + "/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  Write(mem + "/docker/memory.limit_in_bytes", absl::StrCat(8 * kGiB));
  Write(mem + "/docker/memory.usage_in_bytes", absl::StrCat(7 * kGiB));
  Write(mem + "/docker/abc/memory.limit_in_bytes", absl::StrCat(6 * kGiB));
  Write(mem + "/docker/abc/memory.usage_in_bytes", absl::StrCat(2 * kGiB));
  Write(mem + "/docker/abc/memory.stat", absl::StrCat("cache 9\ntotal_inactive_file ", 512 * kKiB * 1024, "\n"));
  auto m = ReadHostMemory(s_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->total_bytes, 6 * kGiB);
  EXPECT_EQ(m->available_bytes, kGiB);  // the parent's 8 - 7 is tighter than the leaf's 6 - 1.5
  EXPECT_EQ(m->limited_by, mem + "/docker");
}

TEST_F(HostMemoryTest, AMeminfoWithoutTheFiguresIsAnErrorNamingIt) {
  Write(s_.proc + "/meminfo", "MemTotal: 100 kB\n");
  auto m = ReadHostMemory(s_);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(m.status().message().find(s_.proc + "/meminfo"), std::string::npos);
}

TEST(HostMemoryOfThisMachineTest, FiguresAreSane) {
  auto m = ReadHostMemory();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->total_bytes, 0);
  EXPECT_GE(m->available_bytes, 0);
  EXPECT_LE(m->available_bytes, m->total_bytes);
}

}  // namespace
}  // namespace txl
