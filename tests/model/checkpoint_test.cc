// Checkpoint I/O (docs/FORMATS.md, "Checkpoint") and the LanguageModel facade on top.
#include <ATen/record_function.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "model/kernels/sampling_kernels.h"
#include "model/net/archive.h"
#include "model/net/checkpoint.h"
#include "model/net/incremental.h"
#include "model/net/language_model.h"
#include "model/net/shared_slot_pools.h"
#include "tests/model/model_fixture.h"

#if defined(__SANITIZE_ADDRESS__)
#define TXL_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TXL_TEST_UNDER_ASAN 1
#endif
#endif

#ifdef TXL_TEST_UNDER_ASAN
// ASan aborts on an allocation it cannot make unless told to fail it, as
// the C library does: model_test checks that an impossible session memory
// reservation is refused (ReservingSessionMemory...), and it must be under
// ASan too. The environment's ASAN_OPTIONS still apply on top.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace txl {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("txl_ckpt_" + std::to_string(::getpid()) + "_" +
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
  std::string WriteEdited(const std::string& name, const std::function<void(std::vector<ArchiveTensor>&)>& edit,
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

  using Records = std::vector<std::pair<std::string, std::string>>;  // name, contents

  // Saves the model, then writes its archive again with every record (the version aside,
  // which the writer adds) after `edit` had its way: sizes and CRCs stay valid.
  std::string RewriteRecords(const std::string& name, const std::function<void(Records&)>& edit) {
    const std::string good = Path("good_" + name);
    EXPECT_TRUE(SaveCheckpoint(good, config_, tokenizer_, weights_).ok());
    Records records;
    caffe2::serialize::PyTorchStreamReader reader(good);
    for (const std::string& record : reader.getAllRecords()) {
      if (record == "version" || record == ".data/version") continue;
      auto [data, size] = reader.getRecord(record);
      records.emplace_back(record, std::string(static_cast<const char*>(data.get()), size));
    }
    edit(records);
    std::string bytes;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&bytes](const void* p, size_t n) {
        bytes.append(static_cast<const char*>(p), n);
        return n;
      });
      for (const auto& [record, contents] : records) writer.writeRecord(record, contents.data(), contents.size());
      writer.writeEndOfFile();
    }
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
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

// Regression (found by tests/fuzz/checkpoint_fuzzer under ASan): a tensor record shorter than
// the tensor its pickle describes was loaded as it was, and the first operation on the tensor
// read past the end of the record's buffer (heap-buffer-overflow in the embedding lookup).
TEST_F(CheckpointTest, TruncatedTensorRecord) {
  const std::string path = RewriteRecords("short.pt", [](Records& records) {
    auto largest = records.end();
    for (auto it = records.begin(); it != records.end(); ++it) {
      if (it->first.rfind("data/", 0) == 0 && (largest == records.end() || it->second.size() > largest->second.size()))
        largest = it;
    }
    ASSERT_NE(largest, records.end());
    largest->second.resize(5);
  });
  ExpectLoadError(path, {"tensor '", "bytes of data, but its record holds 5", "truncated"});
  LanguageModelOptions options;
  options.path = path;
  EXPECT_EQ(LanguageModel::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// Regression (found by tests/fuzz/checkpoint_fuzzer): a malformed TorchScript code record made
// torch::jit::load throw std::runtime_error, which LoadCheckpoint did not catch (only
// c10::Error): the process aborted instead of refusing the file.
TEST_F(CheckpointTest, MalformedCodeRecord) {
  const std::string path = RewriteRecords("code.pt", [](Records& records) {
    bool cut = false;
    for (auto& [name, contents] : records) {
      if (name.rfind("code/", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) {
        contents = "~";
        cut = true;
      }
    }
    ASSERT_TRUE(cut);
  });
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
  const std::string path = WriteEdited(
      "m.pt", [](auto&) {}, fewer.ToJson());
  ExpectLoadError(path, {"config contradicts the tensors", "layers.2.", "n_layer=2"});
}

TEST_F(CheckpointTest, ConfigContradictsTokenizer) {
  ModelConfig other = config_;
  other.n_token = config_.n_token + 1;
  other.cutoffs = config_.cutoffs;
  const std::string path = WriteEdited(
      "m.pt", [](auto&) {}, other.ToJson());
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
  const std::string path = WriteEdited(
      "m.pt", [](auto&) {}, bad.ToJson());
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
    o.kernels = testing::TestKernels();  // CTest runs these on both paths
    return o;
  }
  std::unique_ptr<LanguageModel> Load() {
    EXPECT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
    auto model = LanguageModel::Create(Options("cpu"));
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }
  // Feeds `tokens` into `state` in one step.
  static void Feed(LanguageModel& model, SessionState* state, std::vector<int> tokens) {
    StepInput in;
    in.session = state;
    in.tokens = std::move(tokens);
    ASSERT_TRUE(model.Step(absl::MakeSpan(&in, 1)).ok());
  }
  // The log-probs of the probe 2..6 after 1..5 fed on top of `state`.
  static std::vector<float> ProbeScores(LanguageModel& model, SessionState* state) {
    StepInput next;
    next.session = state;
    next.tokens = {1, 2, 3, 4, 5};
    next.targets = {2, 3, 4, 5, 6};
    auto out = model.Step(absl::MakeSpan(&next, 1));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0].target_logprobs : std::vector<float>();
  }
  static std::string ImageOf(const SessionState& state) {
    std::string image;
    EXPECT_TRUE(state.AppendTo(&image).ok());
    return image;
  }
};

// int8 weights have no generic (libtorch-op) form: refused with the way out,
// not run; bfloat16 and float32 load on the generic path and say so.
TEST_F(LanguageModelTest, GenericKernelsRefuseInt8AndNameThemselves) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.kernels = Kernels::kGeneric;
  o.dtype = WeightDtype::kInt8;
  auto int8 = LanguageModel::Create(o);
  ASSERT_FALSE(int8.ok());
  EXPECT_EQ(int8.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(int8.status().message().find("--kernels generic"), std::string::npos) << int8.status();
  for (const WeightDtype dtype : {WeightDtype::kFloat32, WeightDtype::kBfloat16}) {
    o.dtype = dtype;
    auto model = LanguageModel::Create(o);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_NE((*model)->KernelPath().find("generic"), std::string::npos) << (*model)->KernelPath();
  }
}

// skinny_max_rows out of 0 to kSkinnyMaxRows is refused, naming the flag
// and its range; within it, the generic path says how many rows it takes.
TEST_F(LanguageModelTest, SkinnyMaxRowsOutOfRangeIsRefused) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.kernels = Kernels::kGeneric;
  for (const int64_t rows : {int64_t{-1}, kSkinnyMaxRows + 1}) {
    o.skinny_max_rows = rows;
    auto refused = LanguageModel::Create(o);
    ASSERT_FALSE(refused.ok()) << rows;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("skinny_max_rows: must be 0 to 32"), std::string::npos)
        << refused.status();
  }
  o.skinny_max_rows = 16;
  auto model = LanguageModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_NE((*model)->KernelPath().find("products of up to 16 rows by SkinnyProduct"), std::string::npos)
      << (*model)->KernelPath();
}

// The pass attention as one scaled_dot_product_attention is the generic
// path's and needs libtorch 2.1 or later: the CPU kernels refuse it, naming the
// flag, and so does a 1.x build (Debian's); the CUDA build (2.11, CI's
// cuda-test phase) runs it and says so.
TEST_F(LanguageModelTest, SdpaPassAttentionNeedsTheGenericPathAndLibtorch2) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.sdpa_pass_attention = true;
  o.kernels = Kernels::kAuto;
  auto refused = LanguageModel::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("sdpa_pass_attention"), std::string::npos) << refused.status();
  o.kernels = Kernels::kGeneric;
  auto generic = LanguageModel::Create(o);
  if (!TorchHasSdpa()) {
    ASSERT_FALSE(generic.ok());
    EXPECT_EQ(generic.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(generic.status().message().find("libtorch 2.1 or later"), std::string::npos) << generic.status();
    return;
  }
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_NE((*generic)->KernelPath().find("pass attention fused"), std::string::npos) << (*generic)->KernelPath();
}

// Decode graphs are for a GPU: the CPU kernels refuse them, naming the flag;
// the generic kernels run their padded steps eagerly and say so.
TEST_F(LanguageModelTest, DecodeGraphsNeedAGpuOrTheGenericKernels) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.decode_graphs = DecodeGraphs::kOn;
  o.kernels = Kernels::kAuto;
  auto refused = LanguageModel::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cuda_graphs"), std::string::npos) << refused.status();
  o.kernels = Kernels::kGeneric;
  auto generic = LanguageModel::Create(o);
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_NE((*generic)->KernelPath().find("padded to buckets"), std::string::npos) << (*generic)->KernelPath();
  // auto: on a GPU only, so a CPU runs as before on either kernels.
  o.decode_graphs = DecodeGraphs::kAuto;
  for (const Kernels kernels : {Kernels::kAuto, Kernels::kGeneric}) {
    o.kernels = kernels;
    auto model = LanguageModel::Create(o);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->KernelPath().find("padded"), std::string::npos) << (*model)->KernelPath();
  }
}

TEST_F(LanguageModelTest, ReservingSessionMemoryTheDeviceCannotHoldIsResourceExhausted) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->ReserveSessionMemory(1 << 20).ok());
  const absl::Status huge = model->ReserveSessionMemory(int64_t{1} << 52);
  if (testing::TestKernels() == Kernels::kGeneric) {
    EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
    EXPECT_NE(huge.message().find("session memory"), std::string::npos) << huge;
    auto s = *model->NewSession(8);  // and the model still works
    StepInput in;
    in.session = s.get();
    in.tokens = {1, 2, 3};
    EXPECT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  } else {
    EXPECT_TRUE(huge.ok()) << "the CPU kernels keep no pool";
  }
}

// Past the session pools' budget (SharedSlotPools::Limit), a session's step
// is granted its rows: admission counted its window. A copy, or a state
// rebuilt beside a session, which it did not count, is RESOURCE_EXHAUSTED
// naming the budget, and moves nothing.
TEST_F(LanguageModelTest, PastThePoolsBudgetASessionsStepIsGrantedAndACopyIsResourceExhausted) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.kernels = Kernels::kGeneric;
  o.shared_pools = std::make_shared<SharedSlotPools>();
  auto model = LanguageModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->JoinSharedPool();
  PoolBudgetConfig budget;
  budget.limit_bytes = int64_t{1} << 40;
  o.shared_pools->Limit(budget);
  const int64_t own = o.shared_pools->held_bytes();  // the pool's first rows
  ASSERT_GT(own, 0);
  budget.limit_bytes = own;  // no room to grow
  o.shared_pools->Limit(budget);
  ASSERT_EQ(o.shared_pools->held_bytes(), own);
  std::vector<std::unique_ptr<SessionState>> held;
  std::vector<int> tokens;
  for (int i = 0; i <= config_.mem_len; ++i) tokens.push_back(i % 5);  // a full window
  // Sessions (admitted: their windows counted) step past the budget.
  while (o.shared_pools->held_bytes() <= own) {
    auto s = (*model)->NewSession(config_.mem_len);
    ASSERT_TRUE(s.ok()) << s.status();
    StepInput in;
    in.session = s->get();
    in.tokens = tokens;
    auto out = (*model)->Step(absl::MakeSpan(&in, 1));
    ASSERT_TRUE(out.ok()) << "session " << held.size() << ": " << out.status();
    held.push_back(*std::move(s));
    ASSERT_LT(held.size(), 100u);
  }
  // A copy (a Score that does not commit) is refused, and moves nothing.
  const int64_t pool = o.shared_pools->held_bytes();
  auto copy = held.front()->Clone();
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted) << copy.status();
  EXPECT_NE(copy.status().message().find("--session_memory_budget"), std::string::npos) << copy.status();
  EXPECT_EQ(o.shared_pools->held_bytes(), pool) << "nothing grew";
  // So is a state rebuilt beside a session's own (StepInput::uncounted).
  auto beside = (*model)->NewSessionAt(config_.mem_len, 7);
  ASSERT_TRUE(beside.ok()) << beside.status();
  StepInput rebuild;
  rebuild.session = beside->get();
  rebuild.tokens = tokens;
  rebuild.uncounted = true;
  auto refused = (*model)->Step(absl::MakeSpan(&rebuild, 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ((*beside)->position(), 7) << "a refused step moves no session";
  EXPECT_EQ(o.shared_pools->held_bytes(), pool) << "nothing grew";
  EXPECT_EQ(held.front()->position(), config_.mem_len + 1);
  StepInput next;
  next.session = held.front().get();
  next.tokens = {1};
  EXPECT_TRUE((*model)->Step(absl::MakeSpan(&next, 1)).ok());
  EXPECT_EQ(held.front()->position(), config_.mem_len + 2);
}

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
  in.want_target_argmax = true;
  in.want_last_distribution = true;
  auto out = model->Step(absl::MakeSpan(&in, 1));
  ASSERT_TRUE(out.ok()) << out.status();
  const StepOutput& o = (*out)[0];
  ASSERT_EQ(o.target_logprobs.size(), 4u);
  ASSERT_EQ(o.last_distribution.size(), static_cast<size_t>(config_.n_token));
  EXPECT_FLOAT_EQ(o.target_logprobs[3], o.last_distribution[9]);
  ASSERT_EQ(o.target_argmax.size(), 4u);
  EXPECT_EQ(o.target_argmax[3],
            std::max_element(o.last_distribution.begin(), o.last_distribution.end()) - o.last_distribution.begin());
  double total = 0;
  for (float lp : o.last_distribution) total += std::exp(lp);
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_EQ(s->position(), 4);
  EXPECT_EQ(s->memory_tokens(), 4);
  auto fork = *s->Clone();
  EXPECT_EQ(fork->position(), 4);
  EXPECT_EQ(fork->memory_bytes(), s->memory_bytes());
}

// Rows of one step ask for lists of different lengths, a pick, or both; each
// agrees with the whole distribution its session reaches. A negative
// top_n is refused before any session moves.
TEST_F(LanguageModelTest, ListsAndPicksAgreeWithTheDistribution) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto a = *model->NewSession(10);
  auto b = *model->NewSession(10);
  auto whole = *model->NewSession(10);
  std::vector<StepInput> in(3);
  for (size_t i = 0; i < in.size(); ++i) in[i].tokens = {5, 6, static_cast<int>(7 + i % 2)};
  in[0].session = a.get();
  in[0].plan.top_n = 2;
  in[0].plan.pick = SamplingPlan::Pick::kArgmax;
  in[1].session = b.get();
  in[1].plan.top_n = 7;
  in[2].session = whole.get();
  in[2].plan.top_n = -1;
  auto refused = model->Step(absl::MakeSpan(in));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("top_n -1 is negative"), std::string::npos) << refused.status();
  EXPECT_EQ(a->position(), 0);
  in[2].plan.top_n = 0;
  in[2].tokens = {5, 6, 7};
  in[2].want_last_distribution = true;
  auto out = model->Step(absl::MakeSpan(in));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float>& d = (*out)[2].last_distribution;
  ASSERT_EQ(d.size(), static_cast<size_t>(config_.n_token));
  const TokenList want = testing::SortedTokens(d.data(), static_cast<int64_t>(d.size()));
  const TokenList& two = (*out)[0].top;
  ASSERT_EQ(two.size(), 2u);
  ASSERT_EQ((*out)[1].top.size(), 7u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(two[i].first, want[i].first);
    EXPECT_NEAR(two[i].second, want[i].second, 1e-5);
  }
  EXPECT_EQ((*out)[0].picked, want[0].first);
  EXPECT_NEAR((*out)[0].picked_logprob, want[0].second, 1e-5);
  EXPECT_TRUE((*out)[1].last_distribution.empty()) << "a list sends no row";
  EXPECT_EQ((*out)[1].picked, -1);
}

// A draw at another temperature and a nucleus are taken over the whole row
// inside the model; what comes out agrees with that row as its session's
// twin receives it. Bad settings are refused before anything runs.
TEST_F(LanguageModelTest, TemperedDrawsAndNucleiStayInTheModel) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  std::vector<std::unique_ptr<SessionState>> s;
  for (int i = 0; i < 3; ++i) s.push_back(*model->NewSession(10));
  std::vector<StepInput> in(3);
  for (int i = 0; i < 3; ++i) {
    in[i].session = s[i].get();
    in[i].tokens = {3, 1, 4, 1, 5};
  }
  in[0].want_last_distribution = true;
  in[1].plan.pick = SamplingPlan::Pick::kDraw;
  in[1].plan.uniform = 0.37;
  in[1].plan.temperature = 0.0f;
  in[2].plan.nucleus_p = 0.8f;
  in[2].plan.temperature = 0.7f;
  auto refused = model->Step(absl::MakeSpan(in));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("draw temperature 0 is not > 0"), std::string::npos) << refused.status();
  in[1].plan.temperature = 0.6f;
  in[2].plan.nucleus_p = 1.0f;
  refused = model->Step(absl::MakeSpan(in));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nucleus_p 1 must be in (0, 1)"), std::string::npos) << refused.status();
  EXPECT_EQ(s[0]->position(), 0);
  in[2].plan.nucleus_p = 0.8f;
  auto out = model->Step(absl::MakeSpan(in));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float>& d = (*out)[0].last_distribution;
  const int64_t V = static_cast<int64_t>(d.size());
  EXPECT_EQ((*out)[1].picked, DrawInIdOrder(d.data(), V, 0.6f, 0.37));
  EXPECT_NEAR((*out)[1].picked_logprob, d[(*out)[1].picked], 1e-5);
  EXPECT_TRUE((*out)[1].last_distribution.empty() && (*out)[2].last_distribution.empty()) << "no row left";
  const NucleusList want = NucleusOf(d.data(), V, 0.7f, 0.8f);
  const TokenList& got = (*out)[2].nucleus;
  ASSERT_EQ(got.size(), want.tokens.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].first, want.tokens[i].first) << "rank " << i;
  EXPECT_NEAR((*out)[2].nucleus_total / want.total, 1.0, 1e-5);
  EXPECT_EQ((*out)[2].picked, -1);
}

// A constrained pick (SamplingPlan::allowed) is the unconstrained pick when
// the constraint allows it, else the pick over the whole row with the other
// tokens at -inf (ConstrainedPick), for argmax, the draw at temperature 1
// (the cheap path, picked again where refused) and a tempered draw. The
// log-prob stays the model's own. Constraints without a pick, or shorter
// than the vocabulary, are refused.
TEST_F(LanguageModelTest, ConstrainedPicksTakeOnlyTheAllowedTokens) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int> history = {3, 1, 4, 1, 5};
  auto reference = *model->NewSession(10);
  StepInput ref;
  ref.session = reference.get();
  ref.tokens = history;
  ref.want_last_distribution = true;
  auto ref_out = model->Step(absl::MakeSpan(&ref, 1));
  ASSERT_TRUE(ref_out.ok()) << ref_out.status();
  const std::vector<float> d = (*ref_out)[0].last_distribution;
  const int64_t V = static_cast<int64_t>(d.size());
  const int best = static_cast<int>(std::max_element(d.begin(), d.end()) - d.begin());
  const int drawn = DrawInIdOrder(d.data(), V, 1.0f, 0.37), tempered = DrawInIdOrder(d.data(), V, 0.6f, 0.37);
  auto all_but = [&](int refused) {
    auto a = std::make_shared<AllowedTokens>();
    a->words.assign(static_cast<size_t>((V + 63) / 64), ~uint64_t{0});
    a->words[static_cast<size_t>(refused / 64)] &= ~(uint64_t{1} << (refused % 64));
    return a;
  };
  auto only = [&](std::vector<int> ids) {
    auto a = std::make_shared<AllowedTokens>();
    a->words.assign(static_cast<size_t>((V + 63) / 64), 0);
    for (int id : ids) a->words[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
    return a;
  };
  std::vector<std::unique_ptr<SessionState>> s;
  std::vector<StepInput> in(8);
  for (size_t i = 0; i < in.size(); ++i) {
    s.push_back(*model->NewSession(10));
    in[i].session = s.back().get();
    in[i].tokens = history;
    in[i].plan.pick = i < 2 ? SamplingPlan::Pick::kArgmax : SamplingPlan::Pick::kDraw;
    in[i].plan.uniform = 0.37;
    in[i].plan.fallback_uniform = 0.81;
  }
  in[0].plan.allowed = only({best, (best + 1) % static_cast<int>(V)});  // allows the argmax
  in[1].plan.allowed = all_but(best);
  in[2].plan.allowed = only({drawn});  // allows the draw
  in[3].plan.allowed = all_but(drawn);
  in[4].plan.allowed = all_but(tempered);
  in[4].plan.temperature = 0.6f;
  in[5].plan.allowed = all_but(drawn);
  in[5].plan.top_n = 3;  // a list is not constrained
  // Two refused rows of one step, with masks in different bins: the
  // shortlist's words, and the last cluster's (the rows are as wide as the
  // last cluster either holds, and the middle ones are not computed).
  ASSERT_GE(config_.cutoffs.size(), 2u);
  std::vector<int> shortlist, last_cluster;
  for (int t = 0; t < config_.cutoffs.front(); ++t) {
    if (t != drawn) shortlist.push_back(t);
  }
  for (int t = static_cast<int>(config_.cutoffs.back()); t < V; ++t) {
    if (t != drawn) last_cluster.push_back(t);
  }
  in[6].plan.allowed = only(shortlist);
  in[7].plan.allowed = only(last_cluster);

  // Refused before anything runs.
  in[0].plan.pick = SamplingPlan::Pick::kNone;
  auto refused = model->Step(absl::MakeSpan(in));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs a pick"), std::string::npos) << refused.status();
  in[0].plan.pick = SamplingPlan::Pick::kArgmax;
  std::shared_ptr<const AllowedTokens> short_one = std::make_shared<AllowedTokens>();  // no words
  std::swap(in[1].plan.allowed, short_one);
  refused = model->Step(absl::MakeSpan(in));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cover 0 ids of"), std::string::npos) << refused.status();
  std::swap(in[1].plan.allowed, short_one);
  EXPECT_EQ(s[0]->position(), 0);

  auto out = model->Step(absl::MakeSpan(in));
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> masked_d(d);
  masked_d[static_cast<size_t>(best)] = -INFINITY;
  EXPECT_EQ((*out)[0].picked, best);
  EXPECT_EQ((*out)[1].picked, std::max_element(masked_d.begin(), masked_d.end()) - masked_d.begin());
  EXPECT_EQ((*out)[2].picked, drawn);
  masked_d = d;
  masked_d[static_cast<size_t>(drawn)] = -INFINITY;
  const int redrawn = DrawInIdOrder(masked_d.data(), V, 1.0f, 0.81);
  EXPECT_EQ((*out)[3].picked, redrawn);
  EXPECT_EQ((*out)[3].picked, ConstrainedPick(d.data(), V, in[3].plan, drawn));
  EXPECT_EQ((*out)[4].picked, ConstrainedPick(d.data(), V, in[4].plan, tempered));
  EXPECT_NE((*out)[4].picked, tempered);
  EXPECT_EQ((*out)[5].picked, redrawn);
  EXPECT_EQ((*out)[6].picked, ConstrainedPick(d.data(), V, in[6].plan, drawn));
  EXPECT_LT((*out)[6].picked, config_.cutoffs.front());
  EXPECT_EQ((*out)[7].picked, ConstrainedPick(d.data(), V, in[7].plan, drawn));
  EXPECT_GE((*out)[7].picked, config_.cutoffs.back());
  ASSERT_EQ((*out)[5].top.size(), 3u);
  EXPECT_EQ((*out)[5].top[0].first, best) << "the list is the model's own";
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_GE((*out)[i].picked, 0) << i;
    EXPECT_TRUE(in[i].plan.allowed->contains((*out)[i].picked)) << i;
    EXPECT_NEAR((*out)[i].picked_logprob, d[static_cast<size_t>((*out)[i].picked)], 1e-5) << "the model's own, " << i;
    EXPECT_TRUE((*out)[i].last_distribution.empty()) << "no row left, " << i;
  }
}

// Regression (generic path): the slot pool grew inside a step, under
// InferenceMode, into tensors that nothing outside a step may change, so the
// next fork (Clone) of any session failed. Several sessions with long windows
// make the pool grow during steps.
TEST_F(LanguageModelTest, SessionsCloneAndExportAfterTheirMemoryGrewInAStep) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  std::vector<std::unique_ptr<SessionState>> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(*model->NewSession(50));
    StepInput in;
    in.session = sessions.back().get();
    for (int t = 0; t < 60; ++t) in.tokens.push_back((t * 5 + i) % static_cast<int>(config_.n_token));
    ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  }
  for (const auto& s : sessions) {
    auto fork = s->Clone();
    ASSERT_TRUE(fork.ok()) << fork.status();
    std::string image;
    ASSERT_TRUE((*fork)->AppendTo(&image).ok());
    auto restored = model->RestoreSession(image);
    ASSERT_TRUE(restored.ok()) << restored.status();
    StepInput in;
    in.session = restored->get();
    in.tokens = {1, 2};
    ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  }
}

// Regression: a ring grown ahead of its positions kept whatever the heap
// held in the slots not written yet, and an exported image carried those
// bytes (server memory, pointers included) to the client. They are zeros.
TEST_F(LanguageModelTest, ImageSlotsNotWrittenYetAreZero) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto s = *model->NewSession(64);
  for (std::vector<int> tokens : {std::vector<int>{1, 2, 3}, std::vector<int>{4}}) {
    StepInput in;
    in.session = s.get();
    in.tokens = tokens;
    ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  }
  std::string image;
  ASSERT_TRUE(s->AppendTo(&image).ok());
  int64_t f[8];
  std::memcpy(f, image.data() + 8, sizeof(f));
  const int64_t n_layer = f[0], heads = f[1], d_head = f[2], position = f[4], capacity = f[6], element = f[7];
  ASSERT_GT(capacity, position);  // grown ahead: 4 positions in 6 slots
  const char* p = image.data() + 8 + sizeof(f);
  for (int64_t t = 0; t < 2 * n_layer * heads; ++t, p += capacity * d_head * element) {
    for (int64_t b = position * d_head * element; b < capacity * d_head * element; ++b) {
      ASSERT_EQ(p[b], 0) << "ring " << t << " byte " << b;
    }
  }
}

// ExportSession/ImportSession rest on this: a restored session continues
// bit for bit like the original, before and after its ring has wrapped.
TEST_F(LanguageModelTest, RestoredSessionContinuesExactly) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  for (int fed : {0, 3, 30}) {  // empty, part-filled, wrapped (mem_len 8)
    auto s = *model->NewSession(8);
    std::vector<int> history;
    for (int i = 0; i < fed; ++i) history.push_back((i * 7 + 3) % static_cast<int>(config_.n_token));
    StepInput in;
    in.session = s.get();
    in.tokens = history;
    if (!history.empty()) {
      ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
    }
    std::string image;
    ASSERT_TRUE(s->AppendTo(&image).ok());
    auto r = model->RestoreSession(image);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->position(), s->position());
    EXPECT_EQ((*r)->memory_bytes(), s->memory_bytes());
    // Each alone, so the same computation runs on both: bit-identical.
    EXPECT_EQ(ProbeScores(*model, s.get()), ProbeScores(*model, r->get())) << "fed " << fed;
  }
  // Damaged or foreign images are refused with a reason, never loaded.
  auto s = *model->NewSession(8);
  StepInput in;
  in.session = s.get();
  in.tokens = {1, 2, 3};
  ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  std::string image;
  ASSERT_TRUE(s->AppendTo(&image).ok());
  EXPECT_EQ(model->RestoreSession(image.substr(0, image.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string other_layers = image;
  other_layers[8] = static_cast<char>(other_layers[8] + 1);  // n_layer follows the 8-byte magic
  auto foreign = model->RestoreSession(other_layers);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("n_layer"), std::string::npos) << foreign.status();
  EXPECT_FALSE(model->RestoreSession("").ok());
  EXPECT_EQ(model->fingerprint().size(), 16u);
}

// Regression: a session with a window of 1 (it sees only the token itself)
// past position 0 exported an image its own server refused as an
// "inconsistent header": no ring ever reaches its position, since it holds nothing.
TEST_F(LanguageModelTest, AWindowOfOneRestoresAtAnyPosition) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto s = *model->NewSession(1);
  Feed(*model, s.get(), {1, 2, 3});
  auto r = model->RestoreSession(ImageOf(*s));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->position(), 3);
  EXPECT_EQ((*r)->memory_tokens(), 0);
}

// NewSessionAt is bounded replay's empty state: from the position it names,
// fed the last ReceptiveField tokens, it answers as the whole history, and
// its image restores and continues like any other.
TEST_F(LanguageModelTest, ASessionStartedLaterContinuesAsTheWholeHistory) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int64_t window = 6, field = model->ReceptiveField(window);
  EXPECT_EQ(field, config_.n_layer * (window - 1));
  EXPECT_EQ(model->ReceptiveField(1), 0);
  std::vector<int> history;
  for (int i = 0; i < 3 * field + 5; ++i) history.push_back((i * 11 + 2) % static_cast<int>(config_.n_token));
  const int64_t n = static_cast<int64_t>(history.size());
  auto whole = *model->NewSession(window);
  auto bounded = *model->NewSessionAt(window, n - field);
  EXPECT_EQ(bounded->position(), n - field);
  EXPECT_EQ(model->NewSessionAt(window, -1).status().code(), absl::StatusCode::kInvalidArgument);
  Feed(*model, whole.get(), history);
  Feed(*model, bounded.get(), std::vector<int>(history.end() - field, history.end()));
  EXPECT_EQ(bounded->position(), n);
  auto restored = model->RestoreSession(ImageOf(*bounded));
  ASSERT_TRUE(restored.ok()) << restored.status();
  const std::vector<float> expected = ProbeScores(*model, whole.get());
  for (SessionState* state : {bounded.get(), restored->get()}) {
    const std::vector<float> got = ProbeScores(*model, state);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5);
  }
}

// Regression (found by tests/fuzz/session_import_fuzzer under UBSan): an image's header is
// client data (ImportSession). Sizes in it overflowed int64 while the expected length was
// computed (undefined behaviour), and a position near the int64 limit was restored as it was,
// so the next step overflowed it.
TEST_F(LanguageModelTest, RestoreRefusesHeadersOutOfRange) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  auto s = *model->NewSession(8);
  StepInput in;
  in.session = s.get();
  for (int i = 0; i < 20; ++i) in.tokens.push_back(i % 5);  // the ring wraps: capacity = mem_len
  ASSERT_TRUE(model->Step(absl::MakeSpan(&in, 1)).ok());
  std::string image;
  ASSERT_TRUE(s->AppendTo(&image).ok());
  ASSERT_TRUE(model->RestoreSession(image).ok());
  // Header fields: int64 at 8 + 8 * i: n_layer, n_head, d_head, mem_len, position, length, capacity.
  const auto with = [&image](std::vector<std::pair<int, int64_t>> fields) {
    std::string patched = image;
    for (auto [i, v] : fields) std::memcpy(&patched[8 + 8 * i], &v, sizeof(v));
    return patched;
  };
  const int64_t huge = int64_t{1} << 61;
  auto sizes = model->RestoreSession(with({{3, huge}, {6, huge}}));
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument) << sizes.status();
  auto position = model->RestoreSession(with({{4, std::numeric_limits<int64_t>::max() - 2}}));
  EXPECT_EQ(position.status().code(), absl::StatusCode::kInvalidArgument) << position.status();
  // A fresh session's image holds no rings, so its length bounds nothing: a huge mem_len
  // overflowed the full-window size that admission reserves (the fuzzer found it).
  std::string fresh;
  ASSERT_TRUE((*model->NewSession(8))->AppendTo(&fresh).ok());
  std::memcpy(&fresh[8 + 8 * 3], &huge, sizeof(huge));
  auto window = model->RestoreSession(fresh);
  EXPECT_EQ(window.status().code(), absl::StatusCode::kInvalidArgument) << window.status();
  EXPECT_EQ(model->FullMemoryBytes(huge), std::numeric_limits<int64_t>::max());
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

// The ATen ops this thread calls itself, not those they call in turn (a CPU's
// bmm selects every batch entry; a GPU's is one launch).
thread_local int64_t t_top_ops = 0;
thread_local int t_op_depth = 0;
std::unique_ptr<at::ObserverContext> EnterOp(const at::RecordFunction&) {
  if (t_op_depth++ == 0) ++t_top_ops;
  return nullptr;
}
void LeaveOp(const at::RecordFunction&, at::ObserverContext*) { --t_op_depth; }

// The row selections (aten::index_select) this thread calls itself.
thread_local int64_t t_top_selects = 0;
std::unique_ptr<at::ObserverContext> EnterSelect(const at::RecordFunction& fn) {
  if (t_op_depth++ == 0 && std::string(fn.name()) == "aten::index_select") ++t_top_selects;
  return nullptr;
}

// A decode step's readout where every session reads the same way takes its
// rows as a slice of the hidden states: no row list uploaded (on a GPU, an
// upload from pageable memory waits for the step's kernels, so the host
// could queue the readout's only after them) and no selection. Where the
// rows interleave with another readout's, they are selected, and each pick
// is its own session's either way. A model without clusters: an adaptive
// softmax's argmax selects the rows whose cluster it enters.
TEST_F(LanguageModelTest, AReadoutOfConsecutiveRowsSlicesThem) {
  ModelConfig flat = testing::SmallConfig();
  flat.n_token = tokenizer_.vocab_size();
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), flat, tokenizer_, testing::TestWeights(flat, 2)).ok());
  for (const Kernels kernels : {Kernels::kAuto, Kernels::kGeneric}) {
    LanguageModelOptions o = Options("cpu");
    o.kernels = kernels;
    auto model = LanguageModel::Create(o);
    ASSERT_TRUE(model.ok()) << model.status();
    // Four sessions with histories of their own; each step feeds one token
    // to each of copies of them, every session picking the argmax, or
    // session 1 drawing; the picks, and the step's selections in *selects.
    std::vector<std::unique_ptr<SessionState>> held;
    for (int b = 0; b < 4; ++b) {
      auto s = (*model)->NewSession(flat.mem_len);
      ASSERT_TRUE(s.ok()) << s.status();
      Feed(**model, s->get(), {b + 1, 2 * b + 1, 3, b});
      held.push_back(*std::move(s));
    }
    auto step = [&](bool one_draws, int64_t* selects) {
      std::vector<std::unique_ptr<SessionState>> copies;
      std::vector<StepInput> in(held.size());
      for (size_t b = 0; b < held.size(); ++b) {
        copies.push_back(*held[b]->Clone());
        in[b].session = copies[b].get();
        in[b].tokens = {static_cast<int>(b) + 2};
        in[b].plan.pick = one_draws && b == 1 ? SamplingPlan::Pick::kDraw : SamplingPlan::Pick::kArgmax;
        in[b].plan.uniform = 0.5;
      }
      const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&EnterSelect, &LeaveOp));
      t_top_selects = 0;
      auto out = (*model)->Step(absl::MakeSpan(in));
      at::removeCallback(handle);
      *selects = t_top_selects;
      std::vector<int> picks;
      EXPECT_TRUE(out.ok()) << out.status();
      if (out.ok()) {
        for (const StepOutput& x : *out) picks.push_back(x.picked);
      }
      return picks;
    };
    int64_t sliced = 0, selected = 0;
    const std::vector<int> all = step(false, &sliced), mixed = step(true, &selected);
    EXPECT_EQ(sliced, 0) << "every session picks the argmax: its rows are a slice";
    EXPECT_GT(selected, 0) << "rows 0, 2 and 3 are selected";
    ASSERT_EQ(all.size(), 4u);
    ASSERT_EQ(mixed.size(), 4u);
    for (size_t b = 0; b < held.size(); ++b) {  // each session's pick, against a step of its own
      auto copy = *held[b]->Clone();
      StepInput in;
      in.session = copy.get();
      in.tokens = {static_cast<int>(b) + 2};
      in.plan.pick = SamplingPlan::Pick::kArgmax;
      auto own = (*model)->Step(absl::MakeSpan(&in, 1));
      ASSERT_TRUE(own.ok()) << own.status();
      EXPECT_EQ(all[b], (*own)[0].picked) << "session " << b;
      if (b != 1) {
        EXPECT_EQ(mixed[b], (*own)[0].picked) << "session " << b;
      }
    }
  }
}

// Scoring (Score; NVIDIA's published setting: every session feeds a segment
// over a full window, each position's target read) on the generic path, a
// GPU's code: a step dispatches the same ops for 1 session as for 4 (8 and
// 32 rows: products by SkinnyProduct) and for 5 as for 16 (40 and 128 rows:
// libtorch's). The new keys go into the pool in place, and the hidden
// states are read whole.
// Before, each session's window was built aside and written back per layer,
// and its rows sliced out: about 40 ops more per session on this 3-layer
// model (on a GPU, copies and uploads), 264 at 1 session and 1,598 at 32.
TEST_F(LanguageModelTest, AScoringStepDispatchesTheSameOpsForAnyNumberOfSessions) {
  ASSERT_TRUE(SaveCheckpoint(Path("m.pt"), config_, tokenizer_, weights_).ok());
  LanguageModelOptions o = Options("cpu");
  o.kernels = Kernels::kGeneric;
  auto model = LanguageModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  // Sessions first..first+count-1, each a full window of its own, score one
  // segment twice (the first warms: any growth happens there); the second
  // step's target log-probs, and its ops in *ops.
  const std::vector<int> segment = {1, 2, 3, 4, 1, 2, 3, 4}, targets = {2, 3, 4, 1, 2, 3, 4, 1};
  auto score = [&](int first, int count, int64_t* ops) {
    std::vector<std::unique_ptr<SessionState>> held;
    std::vector<StepInput> in(count);
    for (int b = 0; b < count; ++b) {
      auto s = (*model)->NewSession(config_.mem_len);
      EXPECT_TRUE(s.ok()) << s.status();
      std::vector<int> fill;
      for (int i = 0; i < config_.mem_len + 3; ++i) fill.push_back((i * 7 + first + b) % 5);
      Feed(**model, s->get(), fill);
      held.push_back(*std::move(s));
      in[b].session = held[b].get();
      in[b].tokens = segment;
      in[b].targets = targets;
    }
    EXPECT_TRUE((*model)->Step(absl::MakeSpan(in)).ok());
    const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&EnterOp, &LeaveOp));
    t_top_ops = 0;
    auto out = (*model)->Step(absl::MakeSpan(in));
    at::removeCallback(handle);
    *ops = t_top_ops;
    std::vector<std::vector<float>> lp;
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok()) {
      for (const StepOutput& x : *out) lp.push_back(x.target_logprobs);
    }
    return lp;
  };
  static_assert(kSkinnyMaxRows == 32, "the pairs' regimes");
  int64_t one = 0, four = 0, five = 0, sixteen = 0;
  score(0, 1, &one);
  score(0, 4, &four);
  score(0, 5, &five);
  const std::vector<std::vector<float>> batched = score(0, 16, &sixteen);
  ASSERT_EQ(batched.size(), 16u);
  for (int b = 0; b < 16; ++b) {  // each session's rows are its own
    int64_t ops = 0;
    const std::vector<std::vector<float>> alone = score(b, 1, &ops);
    ASSERT_EQ(alone.size(), 1u);
    ASSERT_EQ(batched[b].size(), alone[0].size());
    for (size_t t = 0; t < alone[0].size(); ++t) EXPECT_NEAR(batched[b][t], alone[0][t], 1e-5) << "session " << b;
  }
  std::cout << "generic scoring step, " << config_.n_layer << " layers: " << one << " ops at 1 session, " << four
            << " at 4, " << five << " at 5, " << sixteen << " at 16\n";
  ASSERT_GT(one, 10 * config_.n_layer) << "the counter saw the step";
  ASSERT_GT(five, 10 * config_.n_layer) << "the counter saw the step";
  EXPECT_EQ(four, one);
  EXPECT_EQ(sixteen, five);
}

}  // namespace
}  // namespace txl
