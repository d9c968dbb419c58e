#include "model/net/language_model.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "model/kernels/sampling_kernels.h"
#include "model/net/checkpoint.h"
#include "model/net/incremental.h"
#include "model/net/output_layer.h"
#include "model/net/txl_math.h"
#include "model/net/upload.h"
#include "model/net/weights.h"

namespace txl {

void SetThreads(int threads) { at::set_num_threads(threads); }

int ParallelLoopThreads() {
  std::atomic<uint64_t> seen{0};  // a bit per thread number
  at::parallel_for(0, 64 * at::get_num_threads(), 1,
                   [&](int64_t, int64_t) { seen |= uint64_t{1} << std::min(63, at::get_thread_num()); });
  return __builtin_popcountll(seen.load());
}

absl::StatusOr<std::unique_ptr<SessionState>> LanguageModel::RestoreSession(const std::string& data) const {
  try {
    ASSIGN_OR_RETURN(SessionMemory memory, SessionMemory::Parse(data, config_, model_->device(), model_->kv_type()));
    const int64_t full = FullMemoryBytes(memory.mem_len());
    if (full == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("session state: mem_len ", memory.mem_len(), " is out of range"));
    }
    memory.set_full_memory_bytes(full);
    return std::unique_ptr<SessionState>(new SessionMemory(std::move(memory)));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("restoring a session's memory failed: ", e.what_without_backtrace()));
  }
}

LanguageModel::LanguageModel(ModelConfig config, Tokenizer tokenizer, std::string device_name,
                             std::unique_ptr<IncrementalModel> model)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      device_name_(std::move(device_name)),
      model_(std::move(model)),
      output_(std::make_unique<OutputLayer>(config_, model_->weights())) {}

LanguageModel::~LanguageModel() = default;

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::Create(const LanguageModelOptions& options) {
  std::optional<at::Device> device;
  try {
    device.emplace(options.device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: unknown device '", options.device, "' (use cpu, cuda or cuda:N)"));
  }
  if (!device->is_cpu() && !device->is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", options.device, "' is not supported (use cpu, cuda or cuda:N)"));
  }
  if (device->is_cuda()) {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device: '", options.device, "' asked for, but this libtorch has no CUDA support or no GPU is visible"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (device->has_index() && device->index() >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("device: '", options.device, "' but only ", count, " CUDA device(s) are visible"));
    }
  }
  if (options.threads < 0)
    return absl::InvalidArgumentError(absl::StrCat("threads: must be >= 0, got ", options.threads));
  if (options.threads > 0) SetThreads(options.threads);

  if (options.dtype == WeightDtype::kInt8 && !device->is_cpu()) {
    return absl::FailedPreconditionError(absl::StrCat("dtype: int8 weights run on the CPU kernels only; on ",
                                                      device->str(), " use bfloat16 or float32"));
  }
  if (options.dtype == WeightDtype::kInt8 && options.kernels == Kernels::kGeneric) {
    return absl::FailedPreconditionError(
        "dtype: int8 weights run on the CPU kernels only; with --kernels generic use bfloat16 or float32");
  }
  if (options.decode_graphs == DecodeGraphs::kOn && device->is_cpu() && options.kernels != Kernels::kGeneric) {
    return absl::InvalidArgumentError(
        "cuda_graphs: decode graphs are for a GPU (--device cuda); the CPU kernels decode without them "
        "(--kernels generic runs the same padded steps eagerly, for testing)");
  }
  if (options.sdpa_pass_attention && device->is_cpu() && options.kernels != Kernels::kGeneric) {
    return absl::InvalidArgumentError(
        "sdpa_pass_attention: it is the generic path's (a GPU, or --kernels generic); the CPU kernels attend by "
        "their own fused kernels");
  }
  if (options.sdpa_pass_attention && !TorchHasSdpa()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sdpa_pass_attention: needs libtorch 2.1 or later (at::scaled_dot_product_attention); this "
                     "build's libtorch is ",
                     TORCH_VERSION, " (the CUDA build, scripts/cuda_build.sh, has 2.11)"));
  }
  if (options.skinny_max_rows < 0 || options.skinny_max_rows > kSkinnyMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("skinny_max_rows: must be 0 to ", kSkinnyMaxRows,
                                                   " (rows of a product by our own kernel), got ",
                                                   options.skinny_max_rows));
  }
  IncrementalModel::Precision precision;
  precision.decode_graphs =
      options.decode_graphs == DecodeGraphs::kOn || (options.decode_graphs == DecodeGraphs::kAuto && device->is_cuda());
  precision.dtype = options.dtype;
  precision.kv_dtype = options.kv_dtype;
  precision.kernels = options.kernels;
  precision.split_decode_attention = options.split_decode_attention;
  precision.decode_short_feeds = options.decode_short_feeds;
  precision.bf16_activations = options.bf16_activations;
  precision.sdpa_pass_attention = options.sdpa_pass_attention;
  precision.fused_add_norm = options.fused_add_norm;
  precision.skinny_max_rows = options.skinny_max_rows;
  ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(options.path));
  try {
    // Fingerprint: the config, the tokenizer and every tensor's name, shape
    // and bytes, hashed while the weights are still on the host.
    const std::string config_json = ckpt.config.ToJson();
    uint64_t h = Hash64(config_json.data(), config_json.size());
    for (int64_t i = 0; i < ckpt.tokenizer.vocab_size(); ++i) {
      auto text = ckpt.tokenizer.TokenText(static_cast<int>(i));
      if (text.ok()) h = Hash64(text->data(), text->size(), h);
    }
    for (const auto& named : ckpt.weights->NamedTensors(ckpt.config)) {
      const at::Tensor t = named.tensor.to(at::kCPU, at::kFloat).contiguous();
      h = Hash64(named.name.data(), named.name.size(), h);
      h = Hash64(t.sizes().data(), t.sizes().size() * sizeof(int64_t), h);
      h = Hash64(t.data_ptr(), t.numel() * sizeof(float), h);
    }
    auto model = std::make_unique<IncrementalModel>(ckpt.config, *ckpt.weights, *device, precision);
    std::unique_ptr<LanguageModel> lm(new LanguageModel(ckpt.config, ckpt.tokenizer, device->str(), std::move(model)));
    lm->fingerprint_ = absl::StrFormat("%016x", h);
    lm->dtype_ = options.dtype;
    lm->kv_dtype_ = options.kv_dtype;
    lm->shared_pools_ = options.shared_pools;
    return lm;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("moving the model to ", device->str(), ": ", e.what_without_backtrace()));
  }
}

std::string LanguageModel::KernelPath() const { return model_->KernelPath(); }
std::string LanguageModel::CpuFamily() const { return model_->CpuFamily(); }

absl::Status LanguageModel::ReserveSessionMemory(int64_t bytes) {
  try {
    model_->ReserveSessionMemory(bytes);
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating ", bytes, " bytes of session memory on ", device_name_,
                                                     ": ", e.what_without_backtrace()));
  }
}

void LanguageModel::JoinSharedPool() {
  if (shared_pools_) model_->JoinSharedPool(*shared_pools_);
}

absl::StatusOr<std::unique_ptr<SessionState>> LanguageModel::NewSession(int64_t mem_len) const {
  return NewSessionAt(mem_len, 0);
}

absl::StatusOr<std::unique_ptr<SessionState>> LanguageModel::NewSessionAt(int64_t mem_len, int64_t position) const {
  if (mem_len < 1) return absl::InvalidArgumentError(absl::StrCat("mem_len: must be >= 1, got ", mem_len));
  if (position < 0) return absl::InvalidArgumentError(absl::StrCat("position: must be >= 0, got ", position));
  // Nothing held yet: the first step reserves the ring for the positions it
  // writes (IncrementalModel::Reserve), and a wrapped ring's slot is the
  // position modulo mem_len wherever the history began.
  return std::unique_ptr<SessionState>(new SessionMemory(config_.n_layer, mem_len, FullMemoryBytes(mem_len), position));
}

int64_t LanguageModel::EstimateWeightBytes(const ModelConfig& config, const LanguageModelOptions& options,
                                           int64_t checkpoint_bytes) {
  // Per layer: qkv, o and the two feed-forward matrices (the products --dtype
  // converts); r_net, the embeddings and the output layer stay float32.
  const int64_t inner = config.n_head * config.d_head;
  const int64_t products =
      config.n_layer * (config.d_model * 3 * inner + inner * config.d_model + 2 * config.d_model * config.d_inner);
  int64_t per_product = 4;
  if (options.dtype == WeightDtype::kBfloat16) per_product = 2;
  if (options.dtype == WeightDtype::kInt8) per_product = 2;  // rows and panels, a byte each
  const int64_t rest = std::max<int64_t>(0, checkpoint_bytes - products * 4);
  // Plus 5%: a load also keeps working buffers (the output layer's grow with
  // the vocabulary), measured at up to 4% beyond the weights with 32,000 tokens.
  const int64_t weights = rest + products * per_product;
  return weights + weights / 20;
}

int64_t LanguageModel::ReceptiveField(int64_t mem_len) const {
  return config_.n_layer * std::max<int64_t>(0, mem_len - 1);
}

int64_t LanguageModel::FullMemoryBytes(int64_t mem_len) const {
  const int64_t element = c10::elementSize(model_->kv_type());
  // A full ring: mem_len slots (the mem_len - 1 positions held plus the slot
  // a step writes before it drops the oldest); a window of 1 holds nothing.
  const int64_t slots = mem_len > 1 ? mem_len : 0;
  const int64_t per_slot = config_.n_layer * 2 * config_.n_head * config_.d_head * element;
  int64_t bytes = 0;
  // Saturates: mem_len may come from client data (an imported image).
  if (__builtin_mul_overflow(per_slot, slots, &bytes)) return std::numeric_limits<int64_t>::max();
  return bytes;
}

namespace {

// A draw at another temperature than 1, or a nucleus: sampled over the whole
// row, inside the model.
bool SamplesWholeRow(const StepInput& in) {
  return (in.plan.pick == SamplingPlan::Pick::kDraw && in.plan.temperature != 1.0f) || in.plan.nucleus_p > 0;
}

// The rows of `hidden` belong, in order, to the inputs that SamplesWholeRow. Their whole log-prob rows stay in
// the model; the sampling kernels run on the intra-op threads, a row each.
std::vector<StepOutput> SampleWholeRows(const OutputLayer& output, int64_t V, absl::Span<const StepInput> inputs,
                                        const at::Tensor& hidden) {
  std::vector<const StepInput*> asks;
  for (const StepInput& in : inputs) {
    if (SamplesWholeRow(in)) asks.push_back(&in);
  }
  std::vector<StepOutput> out(asks.size());
  if (asks.empty()) return out;
  at::Tensor rows = output.LogProbs(hidden).to(at::kCPU, at::kFloat).contiguous();
  at::parallel_for(0, static_cast<int64_t>(asks.size()), 1, [&](int64_t from, int64_t to) {
    for (int64_t r = from; r < to; ++r) {
      const SamplingPlan& plan = asks[r]->plan;
      const float* row = rows.data_ptr<float>() + r * V;
      if (plan.pick == SamplingPlan::Pick::kDraw) {
        out[r].picked = DrawInIdOrder(row, V, plan.temperature, plan.uniform);
        if (out[r].picked >= 0) out[r].picked = ConstrainedPick(row, V, plan, out[r].picked);
        if (out[r].picked >= 0) out[r].picked_logprob = row[out[r].picked];
      }
      if (plan.nucleus_p > 0) {
        NucleusList nucleus = NucleusOf(row, V, plan.temperature, plan.nucleus_p);
        out[r].nucleus = std::move(nucleus.tokens);
        out[r].nucleus_total = nucleus.total;
      }
    }
  });
  return out;
}

// The engine's invariants, not checks of a client's input (the service
// validated that); a breach is a bug above, refused before anything runs.
absl::Status CheckStepInputs(absl::Span<const StepInput> inputs, int64_t V) {
  std::set<const SessionState*> seen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    if (in.session == nullptr) return absl::InvalidArgumentError(absl::StrCat("step input ", i, ": no session"));
    if (!seen.insert(in.session).second)
      return absl::InvalidArgumentError(absl::StrCat("step input ", i, ": session given twice"));
    if (in.targets.size() > in.tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step input ", i, ": ", in.targets.size(), " targets for ", in.tokens.size(), " tokens"));
    }
    const SamplingPlan& plan = in.plan;
    if (plan.pick == SamplingPlan::Pick::kDraw && !(plan.temperature > 0 && std::isfinite(plan.temperature))) {
      return absl::InvalidArgumentError(
          absl::StrCat("step input ", i, ": draw temperature ", plan.temperature, " is not > 0"));
    }
    if (plan.nucleus_p != 0 &&
        !(plan.nucleus_p > 0 && plan.nucleus_p < 1 && plan.temperature > 0 && std::isfinite(plan.temperature))) {
      return absl::InvalidArgumentError(absl::StrCat("step input ", i, ": nucleus_p ", plan.nucleus_p,
                                                     " must be in (0, 1) and temperature ", plan.temperature, " > 0"));
    }
    if (plan.allowed != nullptr) {
      if (plan.pick == SamplingPlan::Pick::kNone || plan.nucleus_p != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("step input ", i, ": a constraint (allowed tokens) needs a pick and no nucleus"));
      }
      if (static_cast<int64_t>(plan.allowed->words.size()) * 64 < V) {
        return absl::InvalidArgumentError(absl::StrCat("step input ", i, ": the allowed tokens cover ",
                                                       plan.allowed->words.size() * 64, " ids of ", V));
      }
      if (plan.pick == SamplingPlan::Pick::kDraw && !(plan.fallback_uniform >= 0 && plan.fallback_uniform < 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("step input ", i, ": fallback uniform ", plan.fallback_uniform, " is outside [0, 1)"));
      }
    }
    if (plan.top_n < 0)
      return absl::InvalidArgumentError(absl::StrCat("step input ", i, ": top_n ", plan.top_n, " is negative"));
    if ((in.want_last_distribution || !plan.empty()) && in.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step input ", i, ": a distribution, a pick or top tokens need at least one token"));
    }
    if (plan.pick == SamplingPlan::Pick::kDraw && !(plan.uniform >= 0 && plan.uniform < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step input ", i, ": draw uniform ", plan.uniform, " is outside [0, 1)"));
    }
    for (const std::vector<int>* list : {&in.tokens, &in.targets}) {
      for (int t : *list) {
        if (t < 0 || t >= V) {
          return absl::InvalidArgumentError(
              absl::StrCat(list == &in.tokens ? "token" : "target", " id ", t, " is outside [0, ", V, ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// The hidden rows of a step by what is asked of them (rows of the model's
// output, in input order). Only distribution rows and rows sampled over the
// whole row build [rows, n_token] log-probs, and only the former copy them
// out.
struct RowPlan {
  std::vector<int64_t> target_rows, argmax_rows, dist_rows, best_rows, draw_rows, top_rows;
  std::vector<size_t> best_inputs, draw_inputs;  // the input of each best and draw row
  std::vector<int64_t> whole_rows;               // SamplesWholeRow
  std::vector<int> targets;
  int top_n = 0;
  std::vector<double> uniforms;
};

RowPlan PlanRows(absl::Span<const StepInput> inputs) {
  RowPlan r;
  int64_t offset = 0;
  for (const StepInput& in : inputs) {
    for (size_t t = 0; t < in.targets.size(); ++t) {
      r.target_rows.push_back(offset + static_cast<int64_t>(t));
      r.targets.push_back(in.targets[t]);
      if (in.want_target_argmax) r.argmax_rows.push_back(offset + static_cast<int64_t>(t));
    }
    const int64_t last = offset + static_cast<int64_t>(in.tokens.size()) - 1;
    if (in.want_last_distribution) r.dist_rows.push_back(last);
    if (in.plan.pick == SamplingPlan::Pick::kArgmax) {
      r.best_rows.push_back(last);
      r.best_inputs.push_back(static_cast<size_t>(&in - inputs.data()));
    }
    if (in.plan.pick == SamplingPlan::Pick::kDraw && in.plan.temperature == 1.0f) {
      r.draw_rows.push_back(last);
      r.draw_inputs.push_back(static_cast<size_t>(&in - inputs.data()));
      r.uniforms.push_back(in.plan.uniform);
    }
    if (SamplesWholeRow(in)) r.whole_rows.push_back(last);
    if (in.plan.top_n > 0) {
      r.top_rows.push_back(last);
      r.top_n = std::max(r.top_n, in.plan.top_n);
    }
    offset += static_cast<int64_t>(in.tokens.size());
  }
  return r;
}

// What the output layer read from a step's rows (ReadRows), each list in
// input order.
struct RowReadouts {
  std::vector<float> target_lp;
  TokenPicks target_best, best, drawn;
  std::vector<TokenList> tops;
  std::vector<StepOutput> sampled;  // SampleWholeRows
  at::Tensor dist;                  // [dist rows, n_token] float32 on the CPU
};

RowReadouts ReadRows(const OutputLayer& output, int64_t V, absl::Span<const StepInput> inputs, const RowPlan& plan,
                     const at::Tensor& hidden, const at::Device& device) {
  // Rows [from, to) of a list: a slice where they follow each other (a
  // decode step whose sessions all read the same way: no upload, no
  // selection), else selected by an upload that does not wait.
  auto rows_of = [&](const std::vector<int64_t>& rows, size_t from, size_t to) {
    std::vector<int64_t> part(rows.begin() + from, rows.begin() + to);
    bool consecutive = true;
    for (size_t i = 1; i < part.size() && consecutive; ++i) consecutive = part[i] == part[i - 1] + 1;
    if (part.empty()) return hidden.slice(0, 0, 0);
    TORCH_CHECK(part.back() < hidden.size(0), "readout row ", part.back(), " of ", hidden.size(0));
    if (consecutive) return hidden.slice(0, part.front(), part.back() + 1);
    return hidden.index_select(0, Upload(part, device));
  };
  RowReadouts r;
  // Blocks of rows bound the per-row buffers (the head's log-probs, or
  // whole rows) for long inputs.
  constexpr size_t kBlock = 1024;
  for (size_t from = 0; from < plan.target_rows.size(); from += kBlock) {
    const size_t to = std::min(plan.target_rows.size(), from + kBlock);
    const std::vector<int> block(plan.targets.begin() + from, plan.targets.begin() + to);
    const std::vector<float> lp = output.TargetLogProbs(rows_of(plan.target_rows, from, to), block);
    r.target_lp.insert(r.target_lp.end(), lp.begin(), lp.end());
  }
  for (size_t from = 0; from < plan.argmax_rows.size(); from += kBlock) {
    TokenPicks p = output.BestTokens(rows_of(plan.argmax_rows, from, std::min(plan.argmax_rows.size(), from + kBlock)));
    r.target_best.ids.insert(r.target_best.ids.end(), p.ids.begin(), p.ids.end());
  }
  // Constrained picks (SamplingPlan::allowed) that the constraint refuses
  // are picked again over their rows' allowed clusters; the others cost
  // nothing more. Rows with a constraint compute the head once for both.
  auto constrained = [&](const std::vector<size_t>& of) {
    return std::any_of(of.begin(), of.end(), [&](size_t i) { return inputs[i].plan.allowed != nullptr; });
  };
  auto pick_again = [&](const at::Tensor& block, const at::Tensor& head, const std::vector<size_t>& of,
                        TokenPicks& picks) {
    std::vector<int64_t> refused;
    std::vector<const AllowedTokens*> allowed;
    for (size_t k = 0; k < of.size(); ++k) {
      const SamplingPlan& p = inputs[of[k]].plan;
      if (p.allowed != nullptr && !p.allowed->contains(picks.ids[k])) {
        refused.push_back(static_cast<int64_t>(k));
        allowed.push_back(p.allowed.get());
      }
    }
    if (refused.empty()) return;
    const at::Tensor which = at::tensor(refused, at::kLong).to(device);
    // Only the clusters that hold an allowed token: a mask of the shortlist's words reads the head alone.
    const at::Tensor whole = output.AllowedLogProbs(block.index_select(0, which), allowed, head.index_select(0, which))
                                 .to(at::kCPU, at::kFloat)
                                 .contiguous();
    const int64_t width = whole.size(1);  // up to the last cluster an allowed token is in
    const float* rows_data = whole.data_ptr<float>();
    at::parallel_for(0, static_cast<int64_t>(refused.size()), 1, [&](int64_t from, int64_t to) {
      for (int64_t j = from; j < to; ++j) {
        const size_t k = static_cast<size_t>(refused[static_cast<size_t>(j)]);
        const float* row = rows_data + j * width;
        picks.ids[k] = ConstrainedPick(row, width, inputs[of[k]].plan, picks.ids[k]);
        picks.logprobs[k] = picks.ids[k] >= 0 ? row[picks.ids[k]] : 0.0f;
      }
    });
  };
  if (!plan.best_rows.empty()) {
    const at::Tensor block = rows_of(plan.best_rows, 0, plan.best_rows.size());
    const at::Tensor head = constrained(plan.best_inputs) ? output.HeadLogProbs(block) : at::Tensor();
    r.best = output.BestTokens(block, head);
    if (head.defined()) pick_again(block, head, plan.best_inputs, r.best);
  }
  if (!plan.draw_rows.empty()) {
    const at::Tensor block = rows_of(plan.draw_rows, 0, plan.draw_rows.size());
    const at::Tensor head = constrained(plan.draw_inputs) ? output.HeadLogProbs(block) : at::Tensor();
    r.drawn = output.DrawTokens(block, plan.uniforms, head);
    if (head.defined()) pick_again(block, head, plan.draw_inputs, r.drawn);
  }
  // One selection for the batch at its largest n; each row keeps its own
  // prefix (the first n of a longer list are the top n).
  if (!plan.top_rows.empty()) r.tops = output.TopTokens(rows_of(plan.top_rows, 0, plan.top_rows.size()), plan.top_n);
  r.sampled = SampleWholeRows(output, V, inputs, rows_of(plan.whole_rows, 0, plan.whole_rows.size()));
  if (!plan.dist_rows.empty())
    r.dist = output.LogProbs(rows_of(plan.dist_rows, 0, plan.dist_rows.size())).to(at::kCPU, at::kFloat).contiguous();
  return r;
}

// Deals the readouts out to the inputs' outputs; INTERNAL where a row
// sampled whole had no finite log-probs.
absl::Status FillOutputs(absl::Span<const StepInput> inputs, int64_t V, RowReadouts& r, std::vector<StepOutput>& out) {
  size_t t = 0, a = 0, d = 0, b = 0, w = 0, p = 0, x = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    out[i].target_logprobs.assign(r.target_lp.begin() + t, r.target_lp.begin() + t + in.targets.size());
    t += in.targets.size();
    if (in.want_target_argmax) {
      out[i].target_argmax.assign(r.target_best.ids.begin() + a, r.target_best.ids.begin() + a + in.targets.size());
      a += in.targets.size();
    }
    if (in.want_last_distribution) {
      const float* row = r.dist.data_ptr<float>() + static_cast<int64_t>(d++) * V;
      out[i].last_distribution.assign(row, row + V);
    }
    const SamplingPlan& plan = in.plan;
    if (plan.pick == SamplingPlan::Pick::kArgmax) {
      out[i].picked = r.best.ids[b];
      out[i].picked_logprob = r.best.logprobs[b++];
    } else if (plan.pick == SamplingPlan::Pick::kDraw && plan.temperature == 1.0f) {
      out[i].picked = r.drawn.ids[w];
      out[i].picked_logprob = r.drawn.logprobs[w++];
    }
    if (SamplesWholeRow(in)) {
      StepOutput& whole = r.sampled[x++];
      // A constrained row with nothing to pick fails its own request (picked -1), not the step's.
      if ((plan.pick == SamplingPlan::Pick::kDraw && whole.picked < 0 && plan.allowed == nullptr) ||
          (plan.nucleus_p > 0 && whole.nucleus.empty()))
        return absl::InternalError(absl::StrCat("model step: the log-probs of step input ", i, " are not finite"));
      if (plan.pick == SamplingPlan::Pick::kDraw) {
        out[i].picked = whole.picked;
        out[i].picked_logprob = whole.picked_logprob;
      }
      out[i].nucleus = std::move(whole.nucleus);
      out[i].nucleus_total = whole.nucleus_total;
    }
    if (plan.top_n > 0) {
      out[i].top = std::move(r.tops[p++]);
      if (out[i].top.size() > static_cast<size_t>(plan.top_n)) out[i].top.resize(plan.top_n);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StepOutput>> LanguageModel::Step(absl::Span<StepInput> inputs) {
  const int64_t V = config_.n_token;
  RETURN_IF_ERROR(CheckStepInputs(inputs, V));
  std::vector<StepOutput> out(inputs.size());
  try {
    c10::InferenceMode guard;
    // The readout runs before the memories commit, so a step that fails
    // anywhere moves no session (IncrementalModel::Step).
    const IncrementalModel::Readout readout = [&](const at::Tensor& hidden) {
      RowReadouts readouts = ReadRows(*output_, V, inputs, PlanRows(inputs), hidden, model_->device());
      return FillOutputs(inputs, V, readouts, out);
    };
    try {
      RETURN_IF_ERROR(model_->Step(inputs, readout));
    } catch (const c10::OutOfMemoryError& e) {  // the device's, or the pools' budget (PoolBudget)
      return absl::ResourceExhaustedError(absl::StrCat("model step: ", e.what_without_backtrace()));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("model step failed: ", e.what_without_backtrace()));
  }
  return out;
}

}  // namespace txl
