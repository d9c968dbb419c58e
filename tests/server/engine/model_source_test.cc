// ModelSource: the model a request or a journal record names, from one
// model or from a repository's ready versions; and the NAME@VERSION form.
#include "server/engine/model_source.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/read_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fake_engine.h"

namespace txl {
namespace {

using ::testing::HasSubstr;

TEST(ModelRefTest, ReadsANameAndAPinnedVersionAndNamesABadOne) {
  EXPECT_EQ(ParseModelRef("")->name, "");
  EXPECT_EQ(ParseModelRef("char")->name, "char");
  EXPECT_EQ(ParseModelRef("char")->version, 0);
  auto pinned = ParseModelRef("shakespeare_char@12");
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(pinned->name, "shakespeare_char");
  EXPECT_EQ(pinned->version, 12);
  for (const char* bad : {"@2", "char@", "char@0", "char@02", "char@x", "char@-1", "char@+1", "char@1 ", ".hidden",
                          "a/b", "char@2@3", "char@99999999999999999999"}) {
    auto r = ParseModelRef(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("model: \"", bad, "\" is not a model name")));
  }
}

TEST(ModelSourceTest, OneModelAnswersToItsNameAndVersion) {
  auto source = SingleModel(testing::FakeServed("char", 1));
  EXPECT_EQ((*source->Find({}))->name(), "char");
  EXPECT_EQ((*source->Find({"char", 1}))->version(), 1);
  auto other = source->Find({"word", 0});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(other.status().message(), HasSubstr("model \"word\" is not served (served: char)"));
  EXPECT_THAT(source->Find({"char", 2}).status().message(), HasSubstr("has no version 2 (served: char@1)"));
  EXPECT_TRUE(source->WithFingerprint("fake-256").ok());
  auto gone = source->WithFingerprint("0123");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gone.status().message(), HasSubstr("model 0123 is not served here (serving char@1 fake-256)"));
}

class RepositorySourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/model_source_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Put(const std::string& model, int64_t version) {
    const std::string d = absl::StrCat(dir_, "/", model, "/", version);
    std::filesystem::create_directories(d);
    ASSERT_TRUE(WriteFile(d + "/model.pt", "weights").ok());
  }
  // Each version a fake engine whose vocabulary, hence fingerprint, tells it apart.
  std::unique_ptr<ModelRepository> Open() {
    VersionLoader loader = [](const std::string& name,
                              const RepositoryVersion& v) -> absl::StatusOr<std::shared_ptr<ServedVersion>> {
      return std::shared_ptr<ServedVersion>(
          testing::FakeServed(name, v.version, (name == "char" ? 100 : 200) + v.version));
    };
    auto r = ModelRepository::Create({dir_, *ParseVersionPolicy("all")}, loader);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  std::string dir_;
};

TEST_F(RepositorySourceTest, ANameIsItsNewestVersionAndSeveralModelsNeedOne) {
  Put("char", 1);
  Put("char", 2);
  auto repository = Open();
  ASSERT_NE(repository, nullptr);
  auto source = RepositoryModels(repository.get());
  EXPECT_EQ((*source->Find({}))->version(), 2);  // one model: no name needed
  EXPECT_EQ((*source->Find({"char", 1}))->version(), 1);
  EXPECT_EQ((*source->WithFingerprint("fake-101"))->version(), 1);
  Put("word", 7);
  ASSERT_TRUE(repository->Poll().ok());
  auto unnamed = source->Find({});
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unnamed.status().message(),
              HasSubstr("model: required, this server serves several (char@1, char@2, word@7)"));
  EXPECT_EQ((*source->Find({"word", 0}))->name(), "word");
  EXPECT_EQ(source->Find({"byte", 0}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source->Ready().size(), 3u);
}

TEST_F(RepositorySourceTest, AFingerprintFindsARetiringVersionWhileASessionHoldsIt) {
  Put("char", 1);
  auto repository = Open();
  ASSERT_NE(repository, nullptr);
  auto source = RepositoryModels(repository.get());
  std::shared_ptr<ServedModel> held = *source->Find({"char", 1});  // a session on version 1
  std::filesystem::remove_all(dir_ + "/char/1");                   // removed: retiring at once
  Put("char", 2);
  ASSERT_TRUE(repository->Poll().ok());
  EXPECT_EQ(source->Ready().size(), 1u);
  EXPECT_EQ(source->Loaded().size(), 2u);
  // A session journaled on version 1 (adopted from a replica that is gone) finds it.
  auto found = source->WithFingerprint("fake-101");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->get(), held.get());
  EXPECT_FALSE(source->Find({"char", 1}).ok());  // but takes no new sessions
  found->reset();
  held.reset();
  EXPECT_EQ(source->Loaded().size(), 1u);
  EXPECT_EQ(source->WithFingerprint("fake-101").status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace txl
