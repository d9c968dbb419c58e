// The model repository's layout (DIR/NAME/VERSION/model.pt): which entries
// name models and versions, listing, and PublishCheckpoint's next version,
// written whole and never over an existing one.
#include "base/model_repository_layout.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/read_file.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

class RepositoryLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/repository_layout_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    checkpoint_ = root_ + "/trained.pt";
    ASSERT_TRUE(WriteFile(checkpoint_, "weights").ok());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Touch(const std::string& path) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    ASSERT_TRUE(WriteFile(path, "x").ok());
  }
  std::string root_, checkpoint_;
};

TEST(RepositoryNamesTest, ModelNamesAndVersions) {
  for (const char* ok : {"char", "wt103-base", "m_1.2"}) EXPECT_TRUE(IsModelName(ok)) << ok;
  const std::string too_long(65, 'a');
  for (const std::string bad : {"", ".hidden", "a/b", "a b", "é", too_long.c_str()}) {
    EXPECT_FALSE(IsModelName(bad)) << bad;
  }
  EXPECT_EQ(VersionOf("1"), 1);
  EXPECT_EQ(VersionOf("42"), 42);
  for (const char* bad : {"", "0", "007", "-1", "1a", "v2", "99999999999999999999"})
    EXPECT_EQ(VersionOf(bad), 0) << bad;
}

TEST_F(RepositoryLayoutTest, ScanListsModelsAndVersionsInOrderAndSkipsTheRest) {
  const std::string repo = root_ + "/repo";
  Touch(repo + "/char/1/model.pt");
  Touch(repo + "/char/10/model.pt");
  Touch(repo + "/char/2/model.pt");
  std::filesystem::create_directories(repo + "/char/3");  // being copied by hand: no model.pt yet
  Touch(repo + "/char/.publishing-1/model.pt");           // a publisher's staging
  Touch(repo + "/char/007/model.pt");
  Touch(repo + "/char/notes.txt");
  Touch(repo + "/.trash/1/model.pt");
  Touch(repo + "/README");
  Touch(repo + "/word/1/model.pt");
  auto scan = ScanRepository(repo);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->size(), 2u);
  const auto& c = scan->at("char");
  ASSERT_EQ(c.size(), 4u);
  std::vector<int64_t> order;
  for (const auto& v : c) order.push_back(v.version);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 10}));
  EXPECT_FALSE(c[2].complete);
  EXPECT_TRUE(c[3].complete);
  EXPECT_EQ(c[3].path, repo + "/char/10/model.pt");
  EXPECT_EQ(scan->at("word").size(), 1u);

  auto missing = ScanRepository(root_ + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(root_ + "/nope"), std::string::npos);
}

TEST_F(RepositoryLayoutTest, PublishWritesTheNextVersionWhole) {
  const std::string model = root_ + "/repo/char";
  auto first = PublishCheckpoint(checkpoint_, model);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 1);
  Touch(model + "/7/model.pt");
  auto next = PublishCheckpoint(checkpoint_, model);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 8);
  EXPECT_EQ(ReadFile(model + "/8/model.pt").value(), "weights");
  auto versions = ListVersions(model);
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->size(), 3u);
  // Nothing staged is left behind.
  for (const auto& e : std::filesystem::directory_iterator(model)) {
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
}

// A version that appears between a publisher's listing and its rename is
// never replaced: publishers that race get distinct versions.
TEST_F(RepositoryLayoutTest, ConcurrentPublishersGetDistinctVersions) {
  const std::string model = root_ + "/repo/char";
  std::vector<int64_t> got(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto v = PublishCheckpoint(checkpoint_, model);
      got[i] = v.ok() ? *v : -1;
    });
  }
  for (auto& t : threads) t.join();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(RepositoryLayoutTest, PublishRefusesABadNameAndAMissingCheckpoint) {
  auto bad = PublishCheckpoint(checkpoint_, root_ + "/repo/.hidden");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a model name"), std::string::npos);
  auto missing = PublishCheckpoint(root_ + "/none.pt", root_ + "/repo/char");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(root_ + "/none.pt"), std::string::npos);
  auto versions = ListVersions(root_ + "/repo/char");
  ASSERT_TRUE(versions.ok());
  EXPECT_TRUE(versions->empty());
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/repo/char"));
}

}  // namespace
}  // namespace txl
