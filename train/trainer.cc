#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "model/net/archive.h"
#include "model/net/checkpoint.h"
#include "model/net/txl_math.h"
#include "model/net/weights.h"
#include "nlohmann/json.hpp"
#include "train/data_parallel.h"
#include "train/training_forward.h"

namespace txl {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

std::string Duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
  return absl::StrFormat("%dm%02ds", t / 60, t % 60);
}

// Built on the host, then moved (a no-op on the CPU).
at::Tensor LongTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols, const at::Device& device) {
  return at::tensor(v, at::kLong).view({rows, cols}).to(device);
}

at::Tensor TargetColumn(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::kLong).view({-1, 1}).to(device);
}

// The default generator dropout draws from on `device`.
at::Generator DefaultGenerator(const at::Device& device) { return at::globalContext().defaultGenerator(device); }

std::string StatePath(const std::string& out, int rank) {
  return rank == 0 ? out + ".trainstate" : absl::StrCat(out, ".trainstate.", rank);
}

// Clears the progress bar's line (before a log line), when there is one.
void ClearBar(const TrainOptions& opt, std::ostream& log) {
  if (opt.progress_bar) log << "\r\033[K";
}

// The progress bar at `step` of `max_steps`, redrawn in place; the log lines
// clear it first.
void DrawBar(std::ostream& log, int64_t step, int64_t max_steps, double loss) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(1, max_steps));
  log << "\r[" << std::string(filled, '=') << std::string(kWidth - filled, ' ') << "] "
      << absl::StrFormat("%d/%d loss %.4f", step, max_steps, loss) << std::flush;
}

// One log interval's figures: its tokens, summed loss and steps since it
// started.
struct Interval {
  Clock::time_point start;
  int64_t tokens = 0;
  double loss = 0;
  int64_t steps = 0;

  explicit Interval(Clock::time_point t) : start(t) {}
  void Add(double step_loss, int64_t step_tokens) {
    loss += step_loss;
    ++steps;
    tokens += step_tokens;
  }
  // Logs the interval's line (mean loss, throughput, elapsed time, ETA) at
  // `step`, then starts the next interval.
  void LogAndRestart(std::ostream& log, const TrainOptions& opt, int64_t step, double lr, int64_t tokens_per_step,
                     Clock::time_point run_start) {
    const double secs = Seconds(start);
    const double tps = tokens / std::max(secs, 1e-9);
    const double mean = loss / steps;
    double eta = (opt.max_steps - step) * tokens_per_step / std::max(tps, 1e-9);
    if (opt.time_budget_s > 0) eta = std::min(eta, std::max(0.0, opt.time_budget_s - Seconds(run_start)));
    log << absl::StrFormat("step %d/%d | loss %.4f | bpc %.4f | lr %.3g | %.0f tok/s | elapsed %s | ETA %s\n", step,
                           opt.max_steps, mean, mean / std::log(2.0), lr, tps, Duration(Seconds(run_start)),
                           Duration(eta))
        << std::flush;
    start = Clock::now();
    tokens = 0;
    loss = 0;
    steps = 0;
  }
};

}  // namespace

EvalResult Evaluate(const ModelConfig& config, const TxlWeights& weights, const std::vector<int>& data, int64_t mem_len,
                    int64_t tgt_len, int64_t streams, int64_t max_tokens) {
  at::NoGradGuard no_grad;
  const at::Device device = weights.emb_layers.at(0).device();
  ModelConfig c = config;
  c.mem_len = mem_len;
  c.same_length = true;  // the serving window (docs/MODEL.md, "What is computed")
  std::vector<int> slice = data;
  if (max_tokens > 0 && static_cast<int64_t>(slice.size()) > max_tokens) slice.resize(max_tokens);
  // Fewer streams when the data is short, so that every stream holds a segment.
  streams = std::max<int64_t>(1, std::min<int64_t>(streams, static_cast<int64_t>(slice.size()) / (tgt_len + 1)));
  EvalResult r;
  absl::StatusOr<OrderedBatches> batches = OrderedBatches::Create(slice, streams, 0, streams, tgt_len);
  if (!batches.ok()) return r;
  double nll = 0;
  std::vector<at::Tensor> mems;
  for (int64_t k = 0; k < batches->segments(); ++k) {
    Segment seg = batches->Get(k);
    SegmentOutput out = TrainingForward(c, weights, LongTensor(seg.input, seg.len, streams, device), mems, false);
    mems = out.mems;
    at::Tensor logp = LogProbs(c, weights, out.hidden.reshape({-1, c.d_model}));
    nll -= logp.gather(1, TargetColumn(seg.target, device)).sum().item<double>();
    r.tokens += seg.len * streams;
  }
  r.loss = nll / static_cast<double>(std::max<int64_t>(1, r.tokens));
  r.bpc = r.loss / std::log(2.0);
  r.ppl = std::exp(r.loss);
  return r;
}

struct Trainer::State {
  TrainOptions opt;
  ModelConfig config;  // model hyperparameters; mem_len = serving default
  Tokenizer tokenizer = Tokenizer::Byte();
  CorpusSplit data;
  DataParallel* parallel = nullptr;
  std::unique_ptr<DataParallel> own_parallel;
  OrderedBatches batches;
  at::Device device = at::Device(at::kCPU);  // parallel->device(): with its index on a GPU
  TxlWeights weights;                        // on `device`, like everything below
  std::vector<at::Tensor> params, exp_avg, exp_avg_sq;
  std::vector<at::Tensor> mems;
  int64_t step = 0;

  explicit State(OrderedBatches b) : batches(std::move(b)) {}
  int rank() const { return parallel->rank(); }

  double LearningRate() const {
    if (opt.warmup_steps > 0 && step < opt.warmup_steps)
      return opt.lr * static_cast<double>(step + 1) / static_cast<double>(opt.warmup_steps);
    const double span = static_cast<double>(std::max<int64_t>(1, opt.max_steps - opt.warmup_steps));
    const double progress = std::min(1.0, static_cast<double>(step - opt.warmup_steps) / span);
    return opt.min_lr + 0.5 * (opt.lr - opt.min_lr) * (1.0 + std::cos(M_PI * progress));
  }

  // Adam (betas 0.9 / 0.999, eps 1e-8, bias-corrected), as the original uses.
  void AdamStep(double lr) {
    at::NoGradGuard no_grad;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double t = static_cast<double>(step + 1);
    const double c1 = 1.0 - std::pow(b1, t), c2 = 1.0 - std::pow(b2, t);
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      if (!g.defined()) continue;
      exp_avg[i].mul_(b1).add_(g, 1.0 - b1);
      exp_avg_sq[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      at::Tensor denom = (exp_avg_sq[i] / c2).sqrt_().add_(eps);
      params[i].addcdiv_(exp_avg[i], denom, -lr / c1);
    }
  }

  double ClipGradients() {
    at::NoGradGuard no_grad;
    // Per-tensor float sums, added up in double in order; fetched in one
    // transfer (one sync on a GPU) rather than one .item() each.
    std::vector<at::Tensor> sums;
    for (const at::Tensor& p : params)
      if (p.grad().defined()) sums.push_back(p.grad().pow(2).sum());
    double total = 0;
    if (!sums.empty()) {
      const at::Tensor host = at::stack(sums).to(at::kCPU, at::kDouble);
      const double* v = host.data_ptr<double>();
      for (int64_t i = 0; i < host.numel(); ++i) total += v[i];
    }
    const double norm = std::sqrt(total);
    if (opt.clip > 0 && norm > opt.clip) {
      const double scale = opt.clip / (norm + 1e-6);
      for (const at::Tensor& p : params)
        if (p.grad().defined()) p.grad().mul_(scale);
    }
    return norm;
  }

  absl::Status SaveState() const {
    // Host tensors on disk whatever the device, so that any run can resume.
    std::vector<ArchiveTensor> tensors;
    auto add = [&](const std::string& name, const at::Tensor& t, bool buffer = false) {
      tensors.push_back({name, t.detach().to(at::kCPU), buffer});
    };
    for (size_t i = 0; i < params.size(); ++i) {
      add(absl::StrCat("param.", i), params[i]);
      add(absl::StrCat("exp_avg.", i), exp_avg[i]);
      add(absl::StrCat("exp_avg_sq.", i), exp_avg_sq[i]);
    }
    for (size_t l = 0; l < mems.size(); ++l) add(absl::StrCat("mem.", l), mems[l]);
    at::Tensor rng;
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    add("rng", rng, true);
    if (device.is_cuda()) {
      // Dropout on a GPU draws from that device's generator (its state is a
      // host byte tensor: seed and Philox offset).
      at::Generator gen = DefaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      add("rng_cuda", gen.get_state(), true);
    }
    nlohmann::json meta = {{"step", step},
                           {"params", params.size()},
                           {"mems", mems.size()},
                           {"world_size", parallel->world_size()},
                           {"batch_size", opt.batch_size},
                           {"tgt_len", opt.tgt_len}};
    return WriteArchive(StatePath(opt.out, rank()), tensors, {{"trainstate.json", meta.dump()}});
  }

  absl::Status LoadState() {
    const std::string path = StatePath(opt.out, rank());
    if (!std::filesystem::exists(path)) return absl::NotFoundError(absl::StrCat("resume: no training state at ", path));
    torch::jit::ExtraFilesMap extra = {{"trainstate.json", ""}};
    torch::jit::Module m;
    try {
      m = torch::jit::load(path, at::kCPU, extra);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("resume: ", path, " is unreadable"));
    }
    nlohmann::json meta = nlohmann::json::parse(extra["trainstate.json"], nullptr, false);
    if (meta.is_discarded() || meta.value("params", size_t{0}) != params.size())
      return absl::InvalidArgumentError(absl::StrCat("resume: ", path, " does not match this model"));
    if (meta.value("world_size", 0) != parallel->world_size() ||
        meta.value("batch_size", int64_t{0}) != opt.batch_size || meta.value("tgt_len", int64_t{0}) != opt.tgt_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume: ", path, " was written with world_size ", meta.value("world_size", 0), ", batch_size ",
                       meta.value("batch_size", int64_t{0}), ", tgt_len ", meta.value("tgt_len", int64_t{0}),
                       "; resume with the same values"));
    }
    std::map<std::string, at::Tensor> named;
    for (const auto& p : m.named_parameters(true)) named[p.name] = p.value;
    for (const auto& b : m.named_buffers(true)) named[b.name] = b.value;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(named.at(absl::StrCat("param.", i)));
      exp_avg[i].copy_(named.at(absl::StrCat("exp_avg.", i)));
      exp_avg_sq[i].copy_(named.at(absl::StrCat("exp_avg_sq.", i)));
    }
    mems.clear();
    for (size_t l = 0; l < meta.value("mems", size_t{0}); ++l) {
      const at::Tensor& m = named.at(absl::StrCat("mem.", l));
      mems.push_back(device.is_cpu() ? m.clone() : m.to(device));
    }
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(named.at("rng"));
    }
    // A state written on another kind of device resumes with this device's
    // generator as seeded: the run continues, its dropout masks differ.
    if (auto it = named.find("rng_cuda"); device.is_cuda() && it != named.end()) {
      at::Generator gen = DefaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->second);
    }
    step = meta.value("step", int64_t{0});
    return absl::OkStatus();
  }

  // What one optimizer step leaves for the log: its learning rate, its loss
  // (the mean over the processes, a one-element tensor) and the tokens it fed.
  struct StepResult {
    double lr = 0;
    at::Tensor loss;
    int64_t tokens = 0;
  };

  // One optimizer step on the next segment: forward and backward, the
  // gradients and the loss averaged over the processes (one message), clip,
  // Adam; the memories move on.
  StepResult TrainStep(const ModelConfig& train_config) {
    const int64_t k = step % batches.segments();
    if (k == 0) mems.clear();  // a new pass over the data starts without memory
    Segment seg = batches.Get(k);
    SegmentOutput out =
        TrainingForward(train_config, weights, LongTensor(seg.input, seg.len, opt.batch_size, device), mems, true);
    at::Tensor logp = LogProbs(config, weights, out.hidden.reshape({-1, config.d_model}));
    at::Tensor loss = -logp.gather(1, TargetColumn(seg.target, device)).mean();
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    loss.backward();
    std::vector<at::Tensor> grads;
    for (at::Tensor& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    at::Tensor loss_value = loss.detach().reshape({1}).clone();
    grads.push_back(loss_value);
    parallel->AllReduceMean(grads);  // gradients and the loss, one message
    ClipGradients();
    const double lr = LearningRate();
    AdamStep(lr);
    mems = out.mems;
    ++step;
    return {lr, loss_value, seg.len * opt.batch_size * parallel->world_size()};
  }

  // The run's first line: sizes, processes and streams, where it starts.
  void LogStart(std::ostream& log) const {
    int64_t n_params = 0;
    for (const auto& p : params) n_params += p.numel();
    log << absl::StrFormat(
               "txl-train: %d params, %d train / %d valid tokens, %d process(es) x %d streams, "
               "tgt_len %d, mem_len %d, %d segments per epoch, starting at step %d, on %s%s\n",
               n_params, data.train.size(), data.valid.size(), parallel->world_size(), opt.batch_size, opt.tgt_len,
               opt.mem_len, batches.segments(), step, device.str(),
               parallel->world_size() > 1 ? absl::StrCat(" (rank 0), allreduce over ", parallel->backend())
                                          : std::string())
        << std::flush;
  }

  // Evaluates on the valid split with memory (eval_mem_len) and without;
  // the results go in `report` and a line in the log.
  void EvaluateAndLog(TrainReport* report, std::ostream& log) const {
    ClearBar(opt, log);
    report->eval_mem = Evaluate(config, weights, data.valid, opt.eval_mem_len, opt.eval_tgt_len, opt.eval_streams,
                                opt.eval_max_tokens);
    report->eval_no_mem =
        Evaluate(config, weights, data.valid, 0, opt.eval_tgt_len, opt.eval_streams, opt.eval_max_tokens);
    const double gain = 100.0 * (1.0 - report->eval_mem.bpc / report->eval_no_mem.bpc);
    log << absl::StrFormat(
               "eval step %d | valid bpc %.4f ppl %.3f (mem_len %d) | bpc %.4f (mem_len 0) | "
               "memory gain %.1f%% | %d tokens\n",
               step, report->eval_mem.bpc, report->eval_mem.ppl, opt.eval_mem_len, report->eval_no_mem.bpc, gain,
               report->eval_mem.tokens)
        << std::flush;
  }

  absl::Status SaveAll() const {
    if (opt.out.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(SaveState());
    if (rank() != 0) return absl::OkStatus();
    ModelConfig serving = config;
    serving.mem_len = opt.eval_mem_len;
    serving.same_length = true;
    if (device.is_cpu()) return SaveCheckpoint(opt.out, serving, tokenizer, weights);
    // To() keeps tied tensors one tensor, so the file is laid out as a CPU run's.
    return SaveCheckpoint(opt.out, serving, tokenizer, weights.To(at::Device(at::kCPU)));
  }
};

Trainer::Trainer(std::unique_ptr<State> state) : s_(std::move(state)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options, const ModelConfig& config,
                                                         const Tokenizer& tokenizer, CorpusSplit data,
                                                         DataParallel* parallel) {
  RETURN_IF_ERROR(config.Validate());
  if (config.n_token != tokenizer.vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_token=", config.n_token, " but the tokenizer has ", tokenizer.vocab_size(), " symbols"));
  }
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat(name, " must be >= 1, got ", v));
    return absl::OkStatus();
  };
  for (auto s : {positive("tgt_len", options.tgt_len), positive("batch_size", options.batch_size),
                 positive("max_steps", options.max_steps), positive("eval_tgt_len", options.eval_tgt_len),
                 positive("eval_streams", options.eval_streams)}) {
    RETURN_IF_ERROR(s);
  }
  if (options.mem_len < 0) return absl::InvalidArgumentError("mem_len must be >= 0");
  if (options.eval_mem_len < 0) return absl::InvalidArgumentError("eval_mem_len must be >= 0");
  if (!(options.lr > 0)) return absl::InvalidArgumentError(absl::StrCat("lr must be > 0, got ", options.lr));
  if (options.resume && options.out.empty()) {
    return absl::InvalidArgumentError("resume needs out (the checkpoint path the training state lies beside)");
  }
  ASSIGN_OR_RETURN(const at::Device wanted, ParseTrainingDevice(options.device));

  std::unique_ptr<DataParallel> own;
  if (parallel == nullptr) {
    ASSIGN_OR_RETURN(own, DataParallel::FromEnvironment(wanted));
    parallel = own.get();
  }
  const at::Device device = parallel->device();
  if (device.type() != wanted.type() || (wanted.is_cuda() && wanted.has_index() && device != wanted)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", options.device, "' asked for, but the process group was set up for ", device.str()));
  }
  const int64_t W = parallel->world_size(), B = options.batch_size;
  absl::StatusOr<OrderedBatches> batches =
      OrderedBatches::Create(data.train, W * B, parallel->rank() * B, B, options.tgt_len);
  if (!batches.ok()) return absl::InvalidArgumentError(absl::StrCat("training data: ", batches.status().message()));
  if (data.valid.size() < 2) return absl::InvalidArgumentError("the validation split has fewer than 2 tokens");

  auto s = std::make_unique<State>(*std::move(batches));
  s->opt = options;
  s->config = config;
  s->tokenizer = tokenizer;
  s->data = std::move(data);
  s->parallel = parallel;
  s->own_parallel = std::move(own);
  s->device = device;
  at::manual_seed(options.seed);  // every device's default generator
  // Initialised on the host from the seed (the same weights on any device), then moved.
  s->weights = InitWeights(config, options.seed);
  if (!device.is_cpu()) {
    try {
      s->weights = s->weights.To(device);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("moving the model to ", device.str(), ": ", e.what_without_backtrace()));
    }
  }
  s->params = s->weights.Parameters(config);
  parallel->Broadcast(s->params);  // identical start on every rank
  for (at::Tensor& p : s->params) {
    p.requires_grad_(true);
    s->exp_avg.push_back(at::zeros_like(p));
    s->exp_avg_sq.push_back(at::zeros_like(p));
  }
  // Dropout masks differ per rank, as in torch's DDP.
  at::manual_seed(options.seed + 1000003ULL * static_cast<uint64_t>(parallel->rank()));
  if (options.resume) {
    RETURN_IF_ERROR(s->LoadState());
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

absl::StatusOr<TrainReport> Trainer::Run(std::ostream& log) {
  State& s = *s_;
  const TrainOptions& opt = s.opt;
  const bool lead = s.rank() == 0;
  ModelConfig train_config = s.config;
  train_config.mem_len = opt.mem_len;
  train_config.same_length = opt.same_length;
  std::ofstream loss_log;
  if (lead && !opt.loss_log.empty()) loss_log.open(opt.loss_log, opt.resume ? std::ios::app : std::ios::trunc);

  const int64_t tokens_per_step = opt.tgt_len * opt.batch_size * s.parallel->world_size();
  const auto start = Clock::now();
  Interval interval(start);
  int64_t steps_this_run = 0;
  TrainReport report;
  if (lead) s.LogStart(log);

  while (s.step < opt.max_steps) {
    // Stop early: the time budget, or the steps this run may take.
    if (opt.time_budget_s > 0 && Seconds(start) >= opt.time_budget_s) {
      if (lead) ClearBar(opt, log);
      if (lead) log << "time budget of " << opt.time_budget_s << " s reached at step " << s.step << "\n";
      break;
    }
    if (opt.steps_this_run > 0 && steps_this_run >= opt.steps_this_run) break;
    const State::StepResult result = s.TrainStep(train_config);
    ++steps_this_run;

    // The step's loss: the report, the interval, the loss log and the bar.
    const double step_loss = result.loss.item<double>();
    report.last_loss = step_loss;
    interval.Add(step_loss, result.tokens);
    if (loss_log.is_open()) loss_log << s.step << " " << absl::StrFormat("%.7f", step_loss) << "\n";
    if (lead && opt.progress_bar) DrawBar(log, s.step, opt.max_steps, step_loss);
    if (lead && (s.step % opt.log_interval == 0 || s.step == opt.max_steps)) {
      ClearBar(opt, log);
      interval.LogAndRestart(log, opt, s.step, result.lr, tokens_per_step, start);
    }
    // Evaluations and checkpoints along the way (the last ones follow the loop).
    if (opt.eval_interval > 0 && s.step % opt.eval_interval == 0 && s.step < opt.max_steps && lead) {
      s.EvaluateAndLog(&report, log);
    }
    if (opt.checkpoint_interval > 0 && s.step % opt.checkpoint_interval == 0 && s.step < opt.max_steps) {
      RETURN_IF_ERROR(s.SaveAll());
    }
  }
  report.seconds = Seconds(start);
  report.steps = s.step;
  report.tokens_per_second = steps_this_run * tokens_per_step / std::max(report.seconds, 1e-9);
  if (lead) s.EvaluateAndLog(&report, log);
  RETURN_IF_ERROR(s.SaveAll());
  if (lead && !opt.out.empty()) log << "wrote " << opt.out << "\n";
  return report;
}

}  // namespace txl
