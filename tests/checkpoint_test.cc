// Checkpoint I/O (DESIGN section 5) and the LanguageModel facade on top.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/archive.h"
#include "model/checkpoint.h"
#include "model/language_model.h"
#include "tests/model_fixture.h"

namespace txl {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("txl_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    config_ = testing::Variants()[2].config;  // adaptive, tied: the most names
    tokenizer_ = *Tokenizer::CharFromCorpus("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV");
    config_.n_token = tokenizer_.vocab_size();
    weights_ = testing::TestWeights(config_, 1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an archive with the model's tensors after `edit` had its way.
  std::string WriteEdited(const std::string& name,
                          const std::function<void(std::vector<ArchiveTensor>&)>& edit,
                          const std::string& config_json = "") {
    std::vector<ArchiveTensor> tensors;
    for (const auto& n : weights_.NamedTensors(config_)) tensors.push_back({n.name, n.tensor, n.is_buffer});
    edit(tensors);
    const std::string path = Path(name);
    EXPECT_TRUE(WriteArchive(path, tensors,
                             {{"config.json", config_json.empty() ? config_.ToJson() : config_json},
                              {"tokenizer.json", tokenizer_.ToJson()}})
                    .ok());
    return path;
  }

  // Loads `path` and expects an error whose message has every fragment.
  void ExpectLoadError(const std::string& path, std::vector<std::string> fragments) {
    absl::StatusOr<Checkpoint> c = LoadCheckpoint(path);
    ASSERT_FALSE(c.ok()) << "loaded " << path;
    fragments.push_back(path);
    for (const std::string& f : fragments)
      EXPECT_NE(c.status().message().find(f), std::string::npos) << c.status().message();
  }

  fs::path dir_;
  ModelConfig config_;
  Tokenizer tokenizer_ = Tokenizer::Byte();
  TxlWeights weights_;
};

TEST_F(CheckpointTest, RoundTripKeepsConfigTokenizerAndEveryTensor) {
  const std::string path = Path("m.pt");
  ASSERT_TRUE(SaveCheckpoint(path, config_, tokenizer_, weights_).ok());
  absl::StatusOr<Checkpoint> c = LoadCheckpoint(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.ToJson(), config_.ToJson());
  EXPECT_EQ(c->tokenizer.ToJson(), tokenizer_.ToJson());
  auto saved = weights_.NamedTensors(config_);
  auto loaded = c->weights->NamedTensors(c->config);
  ASSERT_EQ(saved.size(), loaded.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].name, loaded[i].name);
    EXPECT_TRUE(at::equal(saved[i].tensor, loaded[i].tensor)) << saved[i].name;
  }
  // Tied tensors come back as one tensor.
  EXPECT_TRUE(c->weights->out_w[0].is_same(c->weights->emb_layers[0]));
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_F(CheckpointTest, MissingFile) { ExpectLoadError(Path("nope.pt"), {"no such file"}); }

TEST_F(CheckpointTest, NotAZipFile) {
  std::ofstream(Path("text.pt")) << "hello, I am not an archive";
  ExpectLoadError(Path("text.pt"), {"not a TorchScript archive"});
}

TEST_F(CheckpointTest, TruncatedArchive) {
  const std::string path = Path("m.pt");
  ASSERT_TRUE(SaveCheckpoint(path, config_, tokenizer_, weights_).ok());
  fs::resize_file(path, fs::file_size(path) / 2);
  ExpectLoadError(path, {"not a readable TorchScript archive"});
}

TEST_F(CheckpointTest, MissingTensor) {
  const std::string path = WriteEdited("m.pt", [](std::vector<ArchiveTensor>& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const ArchiveTensor& a) { return a.name == "layers.1.dec_attn.o_net.weight"; }),
            t.end());
  });
  ExpectLoadError(path, {"missing tensor 'layers.1.dec_attn.o_net.weight'"});
}

TEST_F(CheckpointTest, WrongShape) {
  const std::string path = WriteEdited("m.pt", [](std::vector<ArchiveTensor>& t) {
    for (auto& a : t)
      if (a.name == "layers.0.pos_ff.CoreNet.0.weight") a.tensor = at::zeros({7, 3});
  });
  ExpectLoadError(path, {"'layers.0.pos_ff.CoreNet.0.weight' has shape [7, 3]", "config implies [64, 32]"});
}

TEST_F(CheckpointTest, ConfigContradictsTensors) {
  ModelConfig fewer = config_;
  fewer.n_layer = 2;  // the archive holds 3 layers
  const std::string path = WriteEdited("m.pt", [](auto&) {}, fewer.ToJson());
  ExpectLoadError(path, {"config contradicts the tensors", "layers.2.", "n_layer=2"});
}

TEST_F(CheckpointTest, ConfigContradictsTokenizer) {
  ModelConfig other = config_;
  other.n_token = config_.n_token + 1;
  other.cutoffs = config_.cutoffs;
  const std::string path = WriteEdited("m.pt", [](auto&) {}, other.ToJson());
  ExpectLoadError(path, {"config contradicts the tokenizer", "n_token=49"});
}

TEST_F(CheckpointTest, TiedTensorsThatDiffer) {
  const std::string path = WriteEdited("m.pt", [](std::vector<ArchiveTensor>& t) {
    for (auto& a : t)
      if (a.name == "crit.out_layers.1.weight") a.tensor = a.tensor.clone() + 1.0;
  });
  ExpectLoadError(path, {"config contradicts the tensors", "crit.out_layers.1.weight"});
}

TEST_F(CheckpointTest, NonFiniteWeights) {
  const std::string path = WriteEdited("m.pt", [](std::vector<ArchiveTensor>& t) {
    for (auto& a : t) {
      if (a.name == "r_r_bias") {
        a.tensor = a.tensor.clone();
        a.tensor[0][1] = std::nan("");
      }
    }
  });
  ExpectLoadError(path, {"'r_r_bias' has non-finite values"});
}

TEST_F(CheckpointTest, BadConfigJson) {
  ModelConfig bad = config_;
  bad.n_layer = -3;
  const std::string path = WriteEdited("m.pt", [](auto&) {}, bad.ToJson());
  ExpectLoadError(path, {"n_layer must be >= 1, got -3"});
}

TEST_F(CheckpointTest, MissingConfigFile) {
  std::vector<ArchiveTensor> tensors;
  for (const auto& n : weights_.NamedTensors(config_)) tensors.push_back({n.name, n.tensor, n.is_buffer});
  ASSERT_TRUE(WriteArchive(Path("m.pt"), tensors, {{"tokenizer.json", tokenizer_.ToJson()}}).ok());
  ExpectLoadError(Path("m.pt"), {"has no config.json"});
}

class LanguageModelTest : public CheckpointTest {
 protected:
  LanguageModelOptions Options(const std::string& device) const {
    LanguageModelOptions o;
    o.path = Path("m.pt");
    o.device = device;
    return o;
  }
  std::unique_ptr<LanguageModel> Load() {
    EXPECT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
    auto model = LanguageModel::Create(Options("cpu"));
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }
};

TEST_F(LanguageModelTest, RejectsUnknownAndUnavailableDevices) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  auto bad = LanguageModel::Create(Options("toaster"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("toaster"), std::string::npos);
  if (!at::hasCUDA()) {
    auto cuda = LanguageModel::Create(Options("cuda"));
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST_F(LanguageModelTest, BadStepInputChangesNoSession) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto a = *model->NewSession(8);
  auto b = *model->NewSession(8);
  std::vector<StepInput> inputs(2);
  inputs[0].session = a.get();
  inputs[0].tokens = {1, 2, 3};
  inputs[1].session = b.get();
  inputs[1].tokens = {4, static_cast<int>(config_.n_token)};
  auto out = model->Step(absl::MakeSpan(inputs));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("outside [0, 48)"), std::string::npos) << out.status();
  EXPECT_EQ(a->position(), 0);
  EXPECT_EQ(b->position(), 0);
  inputs[1].session = a.get();  // the same session twice
  inputs[1].tokens = {4};
  EXPECT_FALSE(model->Step(absl::MakeSpan(inputs)).ok());
  EXPECT_EQ(a->position(), 0);
  EXPECT_FALSE(model->NewSession(0).ok());
}

TEST_F(LanguageModelTest, TargetsAndDistributionsAgree) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto s = *model->NewSession(10);
  StepInput in;
  in.session = s.get();
  in.tokens = {5, 6, 7, 8};
  in.targets = {6, 7, 8, 9};
  in.want_last_distribution = true;
  auto out = model->Step(absl::MakeSpan(&in, 1));
  ASSERT_TRUE(out.ok()) << out.status();
  const StepOutput& o = (*out)[0];
  ASSERT_EQ(o.target_logprobs.size(), 4u);
  ASSERT_EQ(o.last_distribution.size(), static_cast<size_t>(config_.n_token));
  EXPECT_FLOAT_EQ(o.target_logprobs[3], o.last_distribution[9]);
  ASSERT_EQ(o.target_argmax.size(), 4u);
  EXPECT_EQ(o.target_argmax[3], std::max_element(o.last_distribution.begin(), o.last_distribution.end()) -
                                    o.last_distribution.begin());
  double total = 0;
  for (float lp : o.last_distribution) total += std::exp(lp);
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_EQ(s->position(), 4);
  EXPECT_EQ(s->memory_tokens(), 4);
  auto fork = *s->Clone();
  EXPECT_EQ(fork->position(), 4);
  EXPECT_EQ(fork->memory_bytes(), s->memory_bytes());
}

// The memory budget reserves FullMemoryBytes per session: it must be what a
// full window really holds, not an estimate.
TEST_F(LanguageModelTest, FullMemoryBytesIsWhatAFullWindowHolds) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto s = *model->NewSession(6);
  StepInput in;
  in.session = s.get();
  in.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  EXPECT_EQ(s->memory_tokens(), 5);
  EXPECT_EQ(s->memory_bytes(), model->FullMemoryBytes(6));
  EXPECT_EQ(model->FullMemoryBytes(6),
            config_.n_layer * 2 * 6 * config_.n_head * config_.d_head * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(model->FullMemoryBytes(1), 0);
}

}  // namespace
}  // namespace txl
