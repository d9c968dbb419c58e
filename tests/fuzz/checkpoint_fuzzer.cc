// libFuzzer target: loading a checkpoint (model/net/checkpoint.h) through
// LanguageModel::Create, the way txl-server and the tools load --model. The
// input becomes a file; Create must either fail with a status or give a
// model that runs one step. An exception escaping, a crash or a sanitizer
// report is a finding. Every refusal must name the file (checkpoint.h).
// ReadCheckpointConfig takes each input too, and must agree with a load.
//
// Random bytes rarely get past the zip reader, so most modes start from a
// real checkpoint written at start-up by WriteInitialCheckpoint (a plain one
// and one with an adaptive softmax, div_val 2 and a projected embedding):
//   byte 0 % 4 == 0: the rest of the input is the file, as it is;
//   1: the template with patches applied: repeated [4-byte little-endian
//      offset][1-byte length][bytes], each at offset % file size;
//   2: the template rebuilt as a valid archive (correct CRCs) with one record
//      (byte 1 picks it among those the scope may replace, in archive order)
//      replaced by the rest of the input;
//   3: the template rebuilt with config.json and tokenizer.json replaced by
//      the rest of the input, split at its first NUL byte.
// Bit 2 of byte 0 picks the template.
//
// Scope (environment TXL_FUZZ_CHECKPOINT_SCOPE):
//   "ours" (default; CI and docs/ROBUSTNESS.md): what our code interprets:
//      modes 2 (only the records config.json, tokenizer.json and the tensor
//      storages data/*) and 3; other inputs are skipped.
//   "torch": every mode and record, so libtorch's own zip reader, unpickler
//      and TorchScript parser take mutated input too. Debian's libtorch 1.13
//      has memory-safety bugs there (docs/ROBUSTNESS.md), which this scope
//      finds within minutes: checkpoints are trusted input.
// The Torch code is not instrumented, so coverage guides only through our
// side (checkpoint.cc, model_config.cc, tokenizer.cc, weights.cc, the model's
// construction); crashes inside libtorch are still caught.
#include <caffe2/serialize/inline_container.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "model/net/checkpoint.h"
#include "model/net/language_model.h"
#include "model/tokenizer.h"

namespace {

using namespace txl;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "checkpoint_fuzzer: property broken: %s\n", what.c_str());
    __builtin_trap();
  }
}

struct Template {
  std::string bytes;                                         // the whole file
  std::vector<std::pair<std::string, std::string>> records;  // name (no archive prefix), contents
  std::vector<size_t> all, ours;                             // indices of the records each scope may replace (mode 2)
};

// Records the "ours" scope may replace: those our code reads itself.
bool OursToReplace(const std::string& name) {
  return name == "extra/config.json" || name == "extra/tokenizer.json" || name.rfind("data/", 0) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Check(static_cast<bool>(out), "writing the input file " + path);
}

Template MakeTemplate(const std::string& path, const ModelConfig& config, const Tokenizer& tokenizer) {
  absl::Status s = WriteInitialCheckpoint(path, config, tokenizer, /*seed=*/1, /*init_std=*/0.1);
  Check(s.ok(), "writing a template checkpoint: " + std::string(s.message()));
  Template t;
  t.bytes = ReadFile(path);
  caffe2::serialize::PyTorchStreamReader reader(path);
  for (const std::string& name : reader.getAllRecords()) {
    // The writer adds the version itself; a second one would be a duplicate entry.
    if (name == "version" || name == ".data/version") continue;
    auto [data, size] = reader.getRecord(name);
    if (OursToReplace(name)) t.ours.push_back(t.records.size());
    t.all.push_back(t.records.size());
    t.records.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
  }
  return t;
}

// A valid archive (the writer computes sizes and CRCs) of these records.
std::string Rebuild(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  for (const auto& [name, contents] : records) writer.writeRecord(name, contents.data(), contents.size());
  writer.writeEndOfFile();
  return out;
}

std::string g_dir;
std::string g_input;
std::vector<Template> g_templates;
bool g_torch_scope = false;

void Replace(std::vector<std::pair<std::string, std::string>>* records, const std::string& suffix,
             std::string contents) {
  for (auto& [name, value] : *records) {
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      value = std::move(contents);
      return;
    }
  }
  Check(false, "the template has a record ending in " + suffix);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/txl_checkpoint_fuzzer.XXXXXX";
  Check(mkdtemp(dir) != nullptr, "mkdtemp");
  g_dir = dir;
  g_input = g_dir + "/input.pt";
  SetThreads(1);
  const char* scope = std::getenv("TXL_FUZZ_CHECKPOINT_SCOPE");
  g_torch_scope = scope != nullptr && std::string(scope) == "torch";
  std::fprintf(stderr, "checkpoint_fuzzer: scope %s\n", g_torch_scope ? "torch" : "ours");

  Tokenizer chars = *Tokenizer::CharFromCorpus("abcdefghijklmnopqrstuvwxyz \n.,");
  ModelConfig plain;
  plain.n_token = chars.vocab_size();
  plain.n_layer = 1;
  plain.n_head = 2;
  plain.d_model = 8;
  plain.d_head = 4;
  plain.d_inner = 16;
  plain.mem_len = 8;
  g_templates.push_back(MakeTemplate(g_dir + "/plain.pt", plain, chars));

  ModelConfig adaptive = plain;
  adaptive.n_layer = 2;
  adaptive.d_embed = 8;
  adaptive.cutoffs = {8, 16};
  adaptive.div_val = 2;
  adaptive.tie_projs = {false, true, true};
  adaptive.untie_r = true;
  adaptive.pre_lnorm = true;
  adaptive.clamp_len = 3;
  g_templates.push_back(MakeTemplate(g_dir + "/adaptive.pt", adaptive, chars));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const Template& t = g_templates[(data[0] >> 2) & 1];
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!g_torch_scope && mode < 2) return 0;

  std::string file;
  switch (mode) {
    case 0: file = rest; break;
    case 1: {
      file = t.bytes;
      for (size_t i = 0; i + 5 <= rest.size();) {
        uint32_t offset;
        std::memcpy(&offset, rest.data() + i, 4);
        const size_t n = static_cast<unsigned char>(rest[i + 4]);
        i += 5;
        const size_t at = offset % file.size();
        for (size_t k = 0; k < n && i < rest.size() && at + k < file.size(); ++k, ++i) file[at + k] = rest[i];
      }
      break;
    }
    case 2: {
      if (rest.empty()) return 0;
      auto records = t.records;
      const std::vector<size_t>& choice = g_torch_scope ? t.all : t.ours;
      records[choice[static_cast<unsigned char>(rest[0]) % choice.size()]].second = rest.substr(1);
      file = Rebuild(records);
      break;
    }
    case 3: {
      auto records = t.records;
      const size_t nul = rest.find('\0');
      Replace(&records, "extra/config.json", rest.substr(0, nul));
      Replace(&records, "extra/tokenizer.json", nul == std::string::npos ? "" : rest.substr(nul + 1));
      file = Rebuild(records);
      break;
    }
  }
  WriteFile(g_input, file);

  LanguageModelOptions options;
  options.path = g_input;
  // The config alone (sizing a repository's version before its load): a
  // status or a config, and the config of any file that loads.
  absl::StatusOr<ModelConfig> config_only = ReadCheckpointConfig(g_input);
  Check(config_only.ok() || std::string(config_only.status().message()).find(g_input) != std::string::npos,
        "a config refusal names the file: " + std::string(config_only.status().message()));
  absl::StatusOr<std::unique_ptr<LanguageModel>> model = LanguageModel::Create(options);
  if (model.ok()) {
    Check(config_only.ok() && config_only->ToJson() == (*model)->config().ToJson(),
          "ReadCheckpointConfig gives the config of a checkpoint that loads");
  }
  if (!model.ok()) {
    Check(std::string(model.status().message()).find(g_input) != std::string::npos,
          "a refusal names the file: " + std::string(model.status().message()));
    return 0;
  }
  // A model that loaded must run: one session, a step with targets.
  LanguageModel& lm = **model;
  const int64_t V = lm.config().n_token;
  Check(V >= 1 && lm.tokenizer().vocab_size() == V, "n_token agrees with the tokenizer");
  absl::StatusOr<std::unique_ptr<SessionState>> session = lm.NewSession(4);
  Check(session.ok(), "NewSession on a loaded model");
  StepInput input;
  input.session = session->get();
  input.tokens = {0, static_cast<int>(V - 1), static_cast<int>(V / 2)};
  input.targets = {static_cast<int>(V - 1), 0};
  input.want_last_distribution = true;
  std::vector<StepInput> inputs = {input};
  absl::StatusOr<std::vector<StepOutput>> out = lm.Step(absl::MakeSpan(inputs));
  Check(out.ok(), "a step on a loaded model: " + (out.ok() ? std::string() : std::string(out.status().message())));
  Check(out->size() == 1 && (*out)[0].target_logprobs.size() == 2 &&
            static_cast<int64_t>((*out)[0].last_distribution.size()) == V,
        "a step's outputs have the asked sizes");
  Check((*session)->position() == 3, "the session advanced by its tokens");
  return 0;
}
