// LoadServedModel and the repository with the real loader, on tiny
// checkpoints made here: a good version loads and steps; a truncated file
// and a config that contradicts its tensors are refused naming the file and
// the fault, and the version already serving goes on.
#include "server/engine/model_loader.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/read_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/net/checkpoint.h"
#include "model/net/shared_slot_pools.h"
#include "tests/model/model_fixture.h"

namespace txl {
namespace {

using ::testing::HasSubstr;

ModelConfig Tiny() {
  ModelConfig c = testing::SmallConfig();
  c.n_token = 256;  // the byte tokenizer's
  return c;
}

// One step of `text`'s bytes on a fresh session of `served`; the session.
std::unique_ptr<SessionState> StepNewSession(ServedModel& served, const std::string& text) {
  auto session = served.engine()->NewSession(12);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return nullptr;
  StepInput in;
  in.session = session->get();
  in.tokens.assign(text.begin(), text.end());
  EXPECT_TRUE(served.engine()->Step(absl::MakeSpan(&in, 1)).ok());
  return *std::move(session);
}

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/model_loader_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // DIR/NAME/VERSION/model.pt, a fresh tiny model of `seed`.
  RepositoryVersion Put(const std::string& name, int64_t version, uint64_t seed = 1) {
    const std::string d = absl::StrCat(dir_, "/", name, "/", version);
    std::filesystem::create_directories(d);
    RepositoryVersion v{version, d + "/model.pt", true};
    EXPECT_TRUE(WriteInitialCheckpoint(v.path, Tiny(), Tokenizer::Byte(), seed, 0.3).ok());
    return v;
  }
  std::string dir_;
};

TEST_F(ModelLoaderTest, AGoodVersionLoadsAndSteps) {
  const RepositoryVersion v = Put("tiny", 3);
  auto served = LoadServedModel({}, "tiny", v);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->name(), "tiny");
  EXPECT_EQ((*served)->version(), 3);
  EXPECT_EQ((*served)->config().n_layer, 3);
  EXPECT_EQ((*served)->tokenizer().vocab_size(), 256);
  const std::unique_ptr<SessionState> session = StepNewSession(**served, "hi");
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->position(), 2);
}

// The versions a repository loads with one SharedSlotPools share their
// shape's session pool once checked (a GPU reserves it once for the session
// budget); another shape has its own, and a load its warm-up refuses leaves none.
TEST_F(ModelLoaderTest, CheckedVersionsOfOneShapeShareTheirSessionPool) {
  LanguageModelOptions options;
  options.kernels = Kernels::kGeneric;  // the path that pools sessions, as a GPU's
  options.shared_pools = std::make_shared<SharedSlotPools>();
  // A version that loads but fails its warm-up step (finite weights whose
  // products overflow) leaves no pool behind.
  const RepositoryVersion damaged = Put("tiny", 3, 3);
  auto checkpoint = LoadCheckpoint(damaged.path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  checkpoint->weights->layers[0].ff1_w.mul_(1e30f);
  checkpoint->weights->layers[0].ff2_w.mul_(1e30f);
  ASSERT_TRUE(SaveCheckpoint(damaged.path, checkpoint->config, checkpoint->tokenizer, *checkpoint->weights).ok());
  const auto refused = LoadServedModel(options, "tiny", damaged);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("warm-up step"));
  EXPECT_EQ(options.shared_pools->live(), 0);
  auto v1 = LoadServedModel(options, "tiny", Put("tiny", 1, 1));
  auto v2 = LoadServedModel(options, "tiny", Put("tiny", 2, 2));
  ASSERT_TRUE(v1.ok() && v2.ok());
  EXPECT_EQ(options.shared_pools->live(), 1) << "v1 and v2 hold one pool";
  LanguageModelOptions bf16 = options;
  bf16.kv_dtype = KvDtype::kBfloat16;
  auto other = LoadServedModel(bf16, "tiny", Put("tiny", 4, 4));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(options.shared_pools->live(), 2) << "bfloat16 keys are another shape";
  // Sessions of both versions step side by side in the shared pool.
  for (const auto* served : {&*v1, &*v2}) EXPECT_NE(StepNewSession(**served, "ok"), nullptr);
  // v2 holds the pool v1 made: with v1 gone it is still there.
  v1->reset();
  EXPECT_EQ(options.shared_pools->live(), 2);
  v2->reset();
  EXPECT_EQ(options.shared_pools->live(), 1) << "the bfloat16 version's alone";
}

TEST_F(ModelLoaderTest, ATruncatedFileIsRefusedNamingTheVersionAndTheFile) {
  const RepositoryVersion v = Put("tiny", 2);
  const std::string bytes = *ReadFile(v.path);
  ASSERT_TRUE(WriteFile(v.path, bytes.substr(0, bytes.size() / 2)).ok());
  auto served = LoadServedModel({}, "tiny", v);
  ASSERT_FALSE(served.ok());
  EXPECT_THAT(served.status().message(), HasSubstr(absl::StrCat("tiny version 2 (", v.path, "): ")));
}

TEST_F(ModelLoaderTest, AConfigThatContradictsItsTensorsIsRefused) {
  const RepositoryVersion v = Put("tiny", 1);
  auto checkpoint = LoadCheckpoint(v.path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ModelConfig wrong = checkpoint->config;
  wrong.d_inner = 128;  // the tensors say 64
  ASSERT_TRUE(SaveCheckpoint(v.path, wrong, checkpoint->tokenizer, *checkpoint->weights).ok());
  auto served = LoadServedModel({}, "tiny", v);
  ASSERT_FALSE(served.ok());
  EXPECT_EQ(served.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(served.status().message(), HasSubstr("tensor"));
  EXPECT_THAT(served.status().message(), HasSubstr("tiny version 1"));
}

TEST_F(ModelLoaderTest, TheRepositoryKeepsServingWhenADamagedVersionArrives) {
  Put("tiny", 1);
  auto r = ModelRepository::Create({dir_, {}}, ServedModelLoader({}));
  ASSERT_TRUE(r.ok()) << r.status();
  const RepositoryVersion two = Put("tiny", 2, 7);
  ASSERT_TRUE(WriteFile(two.path, "not a checkpoint").ok());
  ASSERT_TRUE((*r)->Poll().ok());
  auto found = (*r)->Find("tiny");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->version, 1);
  EXPECT_EQ(static_cast<ServedModel*>(found->served.get())->version(), 1);
  auto failed = (*r)->Find("tiny", 2);
  EXPECT_THAT(failed.status().message(), HasSubstr("FAILED: tiny version 2 (" + two.path + "): "));
}

// 5% over the weights for buffers. The layers' products of Tiny(): 3 x (32 x 72 + 24 x 32 + 2 x 32 x 64) floats.
TEST_F(ModelLoaderTest, TheEstimateCountsTheProductsInTheirFormatAndTheRestAsFloat32) {
  const RepositoryVersion v = Put("tiny", 1);
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(v.path));
  const int64_t products = 3 * (32 * 72 + 24 * 32 + 2 * 32 * 64);
  const auto with_buffers = [](int64_t weights) { return weights + weights / 20; };
  LanguageModelOptions o;
  EXPECT_EQ(*EstimateServedBytes(o, v), with_buffers(size));
  o.dtype = WeightDtype::kBfloat16;
  EXPECT_EQ(*EstimateServedBytes(o, v), with_buffers(size - 2 * products));
  o.dtype = WeightDtype::kInt8;
  EXPECT_EQ(*EstimateServedBytes(o, v), with_buffers(size - 2 * products));
  auto missing = EstimateServedBytes({}, {4, dir_ + "/tiny/4/model.pt", true});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteFile(v.path, "PK\x03\x04 and then nothing").ok());
  auto damaged = EstimateServedBytes({}, v);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(damaged.status().message(), HasSubstr(v.path));
}

}  // namespace
}  // namespace txl
