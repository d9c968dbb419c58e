// txl-train: trains a Transformer-XL language model on text files and writes
// checkpoints the server and txl-eval load as they are. Data parallel when
// launched torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// LOCAL_RANK); on the CPU (Gloo) or a GPU (--device cuda: NCCL when libtorch
// has it, else Gloo through host copies).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/flags_help.h"
#include "base/model_repository_layout.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "model/net/language_model.h"
#include "tools/cli_util.h"
#include "train/data_parallel.h"
#include "train/trainer.h"

ABSL_FLAG(std::string, train, "", "training text file(s), comma-separated");
ABSL_FLAG(std::string, valid, "", "validation text file(s); empty: split off --valid_fraction");
ABSL_FLAG(double, valid_fraction, 0.1, "fraction of the training text held out when --valid is empty");
ABSL_FLAG(std::string, tokenizer, "char", "char (vocab from the corpus), byte, or word (--vocab)");
ABSL_FLAG(std::string, vocab, "", "word vocabulary file, one token per line");
ABSL_FLAG(std::string, config, "", "model config JSON (original names); flags below override it");
// Model hyperparameters (original names).
ABSL_FLAG(absl::optional<int64_t>, n_layer, absl::nullopt, "layers");
ABSL_FLAG(absl::optional<int64_t>, n_head, absl::nullopt, "attention heads");
ABSL_FLAG(absl::optional<int64_t>, d_model, absl::nullopt, "model width");
ABSL_FLAG(absl::optional<int64_t>, d_head, absl::nullopt, "head width");
ABSL_FLAG(absl::optional<int64_t>, d_inner, absl::nullopt, "feed-forward width");
ABSL_FLAG(absl::optional<int64_t>, d_embed, absl::nullopt, "embedding width (-1: d_model)");
ABSL_FLAG(absl::optional<int64_t>, div_val, absl::nullopt, "adaptive embedding divisor");
ABSL_FLAG(absl::optional<std::string>, cutoffs, absl::nullopt, "adaptive softmax cutoffs, comma-separated");
ABSL_FLAG(absl::optional<bool>, pre_lnorm, absl::nullopt, "pre-norm layers (give a value: --pre_lnorm=true)");
ABSL_FLAG(absl::optional<bool>, untie_r, absl::nullopt, "per-layer u/v biases (--untie_r=true)");
ABSL_FLAG(absl::optional<int64_t>, clamp_len, absl::nullopt, "clamp relative distances (<= 0: no clamp)");
ABSL_FLAG(absl::optional<double>, dropout, absl::nullopt, "dropout");
ABSL_FLAG(absl::optional<double>, dropatt, absl::nullopt, "attention dropout");
// Training.
ABSL_FLAG(int64_t, tgt_len, 128, "tokens per segment");
ABSL_FLAG(int64_t, mem_len, 128, "training memory length");
ABSL_FLAG(bool, same_length, false, "train with the same-length window");
ABSL_FLAG(int64_t, batch_size, 16, "parallel streams per process");
ABSL_FLAG(double, lr, 1e-3, "peak learning rate (Adam)");
ABSL_FLAG(int64_t, warmup, 100, "linear warm-up steps");
ABSL_FLAG(double, min_lr, 0.0, "cosine decay floor");
ABSL_FLAG(int64_t, max_steps, 1000, "optimizer steps");
ABSL_FLAG(double, time_budget, 0, "stop after this many seconds (0: none)");
ABSL_FLAG(int64_t, steps_this_run, 0, "stop after this many steps, keeping the max_steps schedule (0: no limit)");
ABSL_FLAG(double, clip, 0.25, "gradient norm clip (0: none)");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int64_t, log_interval, 50, "steps between progress lines");
ABSL_FLAG(int64_t, eval_interval, 500, "steps between evaluations (0: only at the end)");
ABSL_FLAG(int64_t, checkpoint_interval, 500, "steps between checkpoints (0: only at the end)");
ABSL_FLAG(int64_t, eval_mem_len, 256, "evaluation (and serving default) mem_len");
ABSL_FLAG(int64_t, eval_tgt_len, 128, "evaluation segment length");
ABSL_FLAG(int64_t, eval_max_tokens, 0, "evaluate on at most this many valid tokens (0: all)");
ABSL_FLAG(std::string, out, "", "checkpoint to write (training state goes to OUT.trainstate)");
ABSL_FLAG(std::string, publish, "",
          "after training, copy the final checkpoint (--out) into this model directory of a repository "
          "(DIR/NAME) as its next version, whole and atomically (docs/OPERATIONS.md, \"Model repository\")");
ABSL_FLAG(bool, resume, false, "continue from OUT.trainstate");
ABSL_FLAG(std::string, loss_log, "", "write 'step loss' for every step to this file");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: libtorch default)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or cuda:N: where the model, gradients, optimizer state and memories live "
          "(plain cuda in a data-parallel run: cuda:LOCAL_RANK); checkpoints are written as CPU tensors");

namespace {

int Fail(int code, const std::string& msg) {
  std::cerr << "txl-train: " << msg << "\n";
  return code;
}

// The trainer's errors name the TrainOptions field at fault ("resume: no training state at ...");
// where this binary has a flag of that name, the user reads it as the flag ("--resume: ...").
std::string AsFlags(absl::string_view message) {
  const size_t end = message.find_first_of(": ");
  if (end != absl::string_view::npos && end > 0 && absl::FindCommandLineFlag(message.substr(0, end)) != nullptr) {
    return absl::StrCat("--", message);
  }
  return std::string(message);
}

absl::StatusOr<std::string> ReadAll(const std::string& list) {
  std::string text;
  for (absl::string_view path : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(const std::string part, txl::ReadFile(std::string(path)));
    text += part;
  }
  return text;
}

// The steps of main below return 0, or the exit code after printing why.

// --train (required, not empty) and --valid (optional: empty when not given).
int ReadCorpora(std::string* train_text, std::string* valid_text) {
  auto train = ReadAll(absl::GetFlag(FLAGS_train));
  if (!train.ok()) return Fail(1, std::string(train.status().message()));
  if (train->empty()) return Fail(1, absl::StrCat("the training corpus ", absl::GetFlag(FLAGS_train), " is empty"));
  *train_text = *std::move(train);
  if (!absl::GetFlag(FLAGS_valid).empty()) {
    auto v = ReadAll(absl::GetFlag(FLAGS_valid));
    if (!v.ok()) return Fail(1, std::string(v.status().message()));
    if (v->empty()) return Fail(1, absl::StrCat("the validation corpus ", absl::GetFlag(FLAGS_valid), " is empty"));
    *valid_text = *std::move(v);
  }
  return 0;
}

// The model: built-in defaults, then the config file, then the flags given;
// n_token from the tokenizer unless the config sets it.
int ModelConfigFromFlags(int64_t vocab_size, txl::ModelConfig* config_out) {
  txl::ModelConfig& config = *config_out;
  config.n_layer = 4;
  config.n_head = 4;
  config.d_model = 128;
  config.d_head = 32;
  config.d_inner = 512;
  config.dropout = 0.1;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto text = txl::ReadFile(path);
    if (!text.ok()) return Fail(1, std::string(text.status().message()));
    auto parsed = txl::ModelConfig::FromJson(*text);
    if (!parsed.ok()) return Fail(1, absl::StrCat(path, ": ", parsed.status().message()));
    config = *parsed;
  }
  auto apply = [](const auto& flag, auto* field) {
    if (flag.has_value()) *field = *flag;
  };
  apply(absl::GetFlag(FLAGS_n_layer), &config.n_layer);
  apply(absl::GetFlag(FLAGS_n_head), &config.n_head);
  apply(absl::GetFlag(FLAGS_d_model), &config.d_model);
  apply(absl::GetFlag(FLAGS_d_head), &config.d_head);
  apply(absl::GetFlag(FLAGS_d_inner), &config.d_inner);
  apply(absl::GetFlag(FLAGS_d_embed), &config.d_embed);
  apply(absl::GetFlag(FLAGS_div_val), &config.div_val);
  apply(absl::GetFlag(FLAGS_clamp_len), &config.clamp_len);
  apply(absl::GetFlag(FLAGS_dropout), &config.dropout);
  apply(absl::GetFlag(FLAGS_dropatt), &config.dropatt);
  apply(absl::GetFlag(FLAGS_pre_lnorm), &config.pre_lnorm);
  apply(absl::GetFlag(FLAGS_untie_r), &config.untie_r);
  if (const auto cutoffs = absl::GetFlag(FLAGS_cutoffs); cutoffs.has_value()) {
    config.cutoffs.clear();
    for (absl::string_view c : absl::StrSplit(*cutoffs, ',', absl::SkipEmpty())) {
      int64_t v;
      if (!absl::SimpleAtoi(c, &v)) return Fail(2, absl::StrCat("--cutoffs: '", c, "' is not an integer"));
      config.cutoffs.push_back(v);
    }
  }
  if (config.n_token == 0) config.n_token = vocab_size;
  if (auto s = config.Validate(); !s.ok()) return Fail(1, std::string(s.message()));
  return 0;
}

// Token ids of both splits; without --valid, --valid_fraction of the
// training text is held out.
int EncodeCorpora(const txl::Tokenizer& tokenizer, const std::string& train_text, const std::string& valid_text,
                  txl::CorpusSplit* split) {
  auto encode = [&](const std::string& text, const char* what) -> absl::StatusOr<std::vector<int>> {
    auto ids = tokenizer.Encode(text);
    if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", ids.status().message()));
    return ids;
  };
  auto train_ids = encode(train_text, "training corpus");
  if (!train_ids.ok()) return Fail(1, std::string(train_ids.status().message()));
  if (valid_text.empty()) {
    auto s = txl::SplitCorpus(*train_ids, absl::GetFlag(FLAGS_valid_fraction));
    if (!s.ok()) return Fail(1, std::string(s.status().message()));
    *split = *std::move(s);
  } else {
    auto valid_ids = encode(valid_text, "validation corpus");
    if (!valid_ids.ok()) return Fail(1, std::string(valid_ids.status().message()));
    split->train = *std::move(train_ids);
    split->valid = *std::move(valid_ids);
  }
  return 0;
}

// The training flags, as the trainer's options.
txl::TrainOptions TrainOptionsFromFlags() {
  txl::TrainOptions opt;
  opt.tgt_len = absl::GetFlag(FLAGS_tgt_len);
  opt.mem_len = absl::GetFlag(FLAGS_mem_len);
  opt.same_length = absl::GetFlag(FLAGS_same_length);
  opt.batch_size = absl::GetFlag(FLAGS_batch_size);
  opt.lr = absl::GetFlag(FLAGS_lr);
  opt.warmup_steps = absl::GetFlag(FLAGS_warmup);
  opt.min_lr = absl::GetFlag(FLAGS_min_lr);
  opt.max_steps = absl::GetFlag(FLAGS_max_steps);
  opt.time_budget_s = absl::GetFlag(FLAGS_time_budget);
  opt.steps_this_run = absl::GetFlag(FLAGS_steps_this_run);
  opt.clip = absl::GetFlag(FLAGS_clip);
  opt.seed = absl::GetFlag(FLAGS_seed);
  opt.log_interval = absl::GetFlag(FLAGS_log_interval);
  opt.eval_interval = absl::GetFlag(FLAGS_eval_interval);
  opt.checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_interval);
  opt.eval_mem_len = absl::GetFlag(FLAGS_eval_mem_len);
  opt.eval_tgt_len = absl::GetFlag(FLAGS_eval_tgt_len);
  opt.eval_max_tokens = absl::GetFlag(FLAGS_eval_max_tokens);
  opt.out = absl::GetFlag(FLAGS_out);
  opt.resume = absl::GetFlag(FLAGS_resume);
  opt.loss_log = absl::GetFlag(FLAGS_loss_log);
  opt.progress_bar = isatty(STDOUT_FILENO) != 0;
  opt.device = absl::GetFlag(FLAGS_device);
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "txl-train --train FILES [--valid FILES] [--config CFG.json] [model and training flags] "
      "[--device cpu|cuda|cuda:N] --out M.pt [--publish REPO/NAME]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_train).empty()) return Fail(2, "--train is required");
  if (absl::GetFlag(FLAGS_out).empty()) return Fail(2, "--out is required");
  const std::string publish = absl::GetFlag(FLAGS_publish);
  if (!publish.empty() && !txl::IsModelName(std::filesystem::path(publish).lexically_normal().filename().string())) {
    return Fail(2, "--publish " + publish +
                       ": its last part must be a model name (1-64 of letters, digits, '_', "
                       "'.' and '-', not starting with '.')");
  }
  if (absl::GetFlag(FLAGS_threads) > 0) txl::SetThreads(absl::GetFlag(FLAGS_threads));
  // Checked before anything is read or any process group joined.
  auto device = txl::ParseTrainingDevice(absl::GetFlag(FLAGS_device), "--device");
  if (!device.ok()) return Fail(2, std::string(device.status().message()));

  // The corpora, the tokenizer and the model.
  std::string train_text, valid_text;
  if (int code = ReadCorpora(&train_text, &valid_text)) return code;
  auto tokenizer =
      txl::TokenizerFromFlags(absl::GetFlag(FLAGS_tokenizer), train_text + valid_text, absl::GetFlag(FLAGS_vocab));
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));
  txl::ModelConfig config;
  if (int code = ModelConfigFromFlags(tokenizer->vocab_size(), &config)) return code;
  txl::CorpusSplit split;
  if (int code = EncodeCorpora(*tokenizer, train_text, valid_text, &split)) return code;

  // The training.
  const txl::TrainOptions opt = TrainOptionsFromFlags();
  if (opt.log_interval < 1) return Fail(2, "--log_interval must be >= 1");
  auto parallel = txl::DataParallel::FromEnvironment(*device);
  if (!parallel.ok()) return Fail(1, std::string(parallel.status().message()));
  auto trainer = txl::Trainer::Create(opt, config, *tokenizer, std::move(split), parallel->get());
  if (!trainer.ok()) return Fail(1, AsFlags(trainer.status().message()));
  auto report = (*trainer)->Run(std::cout);
  if (!report.ok()) return Fail(1, AsFlags(report.status().message()));
  if (!publish.empty() && (*parallel)->rank() == 0) {
    auto version = txl::PublishCheckpoint(opt.out, publish);
    if (!version.ok()) return Fail(1, std::string(version.status().message()));
    std::cout << "published " << publish << "/" << *version << "/" << txl::kModelFileName << std::endl;
  }
  return 0;
}
