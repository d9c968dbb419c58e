// engine_bench: Bench::Run, the groups in the order they run (P5 then P3 on a
// clean heap, P1 and its bandwidth floor P1f, W, S, Q, P2), and the builders
// of ratio and throughput rows.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/engine_bench.h"
#include "model/precision.h"

namespace engine_bench {

namespace {

// Sessions filled by stepping, this many per step (as a server's prefill would).
constexpr int kFillGroup = 4;

}  // namespace

std::vector<Row> Bench::Run() {
  std::vector<Row> rows;
  // ---- P5 then P3: N sessions with full windows. First, while the heap
  // holds nothing freed by the other measurements.
  if (Want("P3")) SessionRows(&rows);
  // ---- P1 and the bandwidth floor: one session, `mem` positions of memory.
  if (Want("P1")) OneSessionRows(&rows);

  if (Want("W")) WRows(&rows);

  // ---- G: decode graphs against none; A: the split decode attention against tensor ops.
  if (Want("G") || Want("A")) GraphRows(&rows);

  // ---- S: scoring segments, NVIDIA's published setting (64 tokens, window 640).
  if (Want("S")) rows.push_back(ScoreRow());

  // ---- Q: reduced precision against float32 (this model, lm_), on the
  // same weights and threads, every measurement interleaved in one loop.
  // The CPU kernels' rows: not on a GPU, nor on the generic path (no int8).
  if (Want("Q") && !cuda_ && kernels_ != txl::Kernels::kGeneric) QRows(&rows);

  // ---- P2: recompute the whole window vs the engine step, per window.
  for (int64_t w : Want("P2") ? sizes_.windows : std::vector<int64_t>{}) rows.push_back(RecomputeRow(w));

  // Reduced precision (--dtype, --kv_dtype: P1, P3, S, G and A only): said in
  // every row. Baselines (P1's hidden-state step) stay float32; P1f's floor
  // counts the reduced weights and memories, its extra figures float32's.
  if (dtype_ != txl::WeightDtype::kFloat32 || kv_dtype_ != txl::KvDtype::kFloat32) {
    for (Row& r : rows) {
      absl::StrAppend(&r.measurement, "; engine with ", txl::DtypeName(dtype_), " weights, ", txl::DtypeName(kv_dtype_),
                      " memories");
    }
  }
  if (sdpa_pass_attention_) {
    for (Row& r : rows) absl::StrAppend(&r.measurement, "; pass attention fused (scaled_dot_product_attention)");
  }
  return rows;
}

// ---- P5 and P3.

std::vector<std::unique_ptr<SessionState>> Bench::NewSessions(int n) {
  std::vector<std::unique_ptr<SessionState>> out;
  for (int i = 0; i < n; ++i) out.push_back(Must(lm_->NewSession(sizes_.mem + 1), "new session"));
  return out;
}

// Fills every window by stepping, kFillGroup sessions per step; session i
// gets the random tokens of seed + i.
void Bench::FillByStepping(std::vector<std::unique_ptr<SessionState>>& sessions, int seed) {
  for (size_t g = 0; g < sessions.size(); g += kFillGroup) {
    std::vector<StepInput> in;
    for (size_t i = g; i < std::min(sessions.size(), g + kFillGroup); ++i) {
      StepInput x;
      x.session = sessions[i].get();
      x.tokens = RandomTokens(sizes_.mem, seed + i);
      in.push_back(std::move(x));
    }
    Must(lm_->Step(absl::MakeSpan(in)), "filling sessions");
  }
}

void Bench::SessionRows(std::vector<Row>* rows) {
  const int N = sizes_.sessions;
  Progress(absl::StrFormat("P5: %d sessions", N));
  auto single = FullSession(sizes_.mem + 1, 9);
  std::vector<SessionState*> one = {single.get()};
  EngineSteps(one, 2);
  std::vector<std::unique_ptr<SessionState>> sessions;
  std::vector<SessionState*> all;
  rows->push_back(MemoryRow(&sessions, &all));

  EngineSteps(all, 1);
  Progress("P3: batched decode");
  rows->push_back(BatchedDecodeRow(all, one));
}

// P5: makes and fills the N sessions (`sessions`, `all`: the same, as
// pointers) and compares the RSS they add with their memory_bytes().
Row Bench::MemoryRow(std::vector<std::unique_ptr<SessionState>>* sessions_out, std::vector<SessionState*>* all_out) {
  const int N = sizes_.sessions;
  const int64_t mem = sizes_.mem;
  // The heap first serves one fill step and then frees it, as a running
  // server's has: the per-step working set (scores, padded batches) is
  // then already resident, and RSS growth measures what the sessions
  // themselves keep (including any heap holes they cause).
  {
    auto warm = NewSessions(kFillGroup);
    FillByStepping(warm, 50);
  }
  // Freed blocks can still be reused by the first sessions (which would
  // flatter them), so the figure is the growth over the second half of
  // the sessions; the growth over all of them is reported too.
  const int64_t rss_before = RssBytes();
  std::vector<std::unique_ptr<SessionState>>& sessions = *sessions_out;
  sessions = NewSessions(N / 2);
  FillByStepping(sessions, 100);
  const int64_t rss_mid = RssBytes();
  {
    auto more = NewSessions(N - N / 2);
    FillByStepping(more, 100 + N);
    for (auto& s : more) sessions.push_back(std::move(s));
  }
  std::vector<SessionState*>& all = *all_out;
  for (auto& s : sessions) all.push_back(s.get());
  EngineSteps(all, 1);  // every window full and one decode step taken
  const int64_t rss_after = RssBytes();
  int64_t mem_bytes = 0;
  for (auto& s : sessions) {
    if (s->memory_tokens() != mem) Fail("a session's window is not full");
    mem_bytes += s->memory_bytes();
  }
  Row p5;
  p5.id = "P5";
  p5.measurement = absl::StrFormat(
      "%d sessions, window full (%d positions): RSS growth over the last %d vs memory_bytes()", N, mem, N - N / 2);
  p5.a_name = "RSS growth per session";
  p5.b_name = "memory_bytes() per session";
  p5.unit = "MB/session";
  const int second_half = N - N / 2;
  p5.a = static_cast<double>(rss_after - rss_mid) / second_half / 1e6;
  p5.b = static_cast<double>(mem_bytes) / N / 1e6;
  p5.a_reps = {p5.a};
  p5.b_reps = {p5.b};
  p5.ratio = p5.a / p5.b;
  p5.target = 1.05;
  p5.at_least = false;
  p5.extra = {{"rss_before_bytes", rss_before},
              {"rss_before_note", "after one warm-up fill step of throwaway sessions, freed; no malloc_trim"},
              {"rss_mid_bytes", rss_mid},
              {"rss_after_bytes", rss_after},
              {"rss_growth_per_session_all", static_cast<double>(rss_after - rss_before) / N},
              {"memory_bytes_total", mem_bytes},
              {"raw_kv_bytes_per_session", config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4}};
  if (cuda_) p5.extra["note"] = "device memory is not in the RSS: not meaningful on cuda";
  return p5;
}

// P3: aggregate tokens/s, all N sessions per step vs one session.
Row Bench::BatchedDecodeRow(const std::vector<SessionState*>& all, const std::vector<SessionState*>& one) {
  const Sizes& z = sizes_;
  const int N = z.sessions;
  Row p3;
  p3.id = "P3";
  p3.measurement = absl::StrFormat("aggregate tokens/s: %d sessions per step vs 1 session (memory %d)", N, z.mem);
  p3.a_name = absl::StrFormat("%d sessions", N);
  p3.b_name = "1 session";
  p3.unit = "tokens/s";
  std::vector<double> a_sec, b_sec;
  Interleave(
      z.reps, [&] { return EngineSteps(all, z.multi_batch); }, [&] { return EngineSteps(one, z.engine_batch); }, &a_sec,
      &b_sec);
  for (double t : a_sec) p3.a_reps.push_back(N / t);
  for (double t : b_sec) p3.b_reps.push_back(1 / t);
  p3.a = Median(p3.a_reps);
  p3.b = Median(p3.b_reps);
  p3.ratio = p3.a / p3.b;
  p3.target = 4;
  p3.extra = {{"step_seconds_32", a_sec}, {"step_seconds_1", b_sec}};
  return p3;
}

// ---- P1 and P1f.

void Bench::OneSessionRows(std::vector<Row>* rows) {
  const int64_t mem = sizes_.mem;
  Progress("P1: hidden-state memory baseline");
  auto s = FullSession(mem + 1, 1);
  std::vector<SessionState*> one = {s.get()};
  std::vector<at::Tensor> mems;
  at::manual_seed(3);
  for (int64_t l = 0; l < config_.n_layer; ++l)
    mems.push_back(at::randn({mem, 1, config_.d_model}, at::TensorOptions().device(device_)));
  EngineSteps(one, 2);  // warm-up (rel table, allocator)
  HiddenStateSteps(mems, 1);
  rows->push_back(HiddenStateRow(one, mems));
  rows->push_back(BandwidthFloorRow(one));
}

// P1: the engine step vs (b) hidden-state memory, one session.
Row Bench::HiddenStateRow(const std::vector<SessionState*>& one, const std::vector<at::Tensor>& mems) {
  const Sizes& z = sizes_;
  Row r;
  r.id = "P1";
  r.measurement = absl::StrFormat("1 session, 1 token/step, memory %d: engine step vs hidden-state memory (b)", z.mem);
  r.a_name = "engine step";
  r.b_name = "hidden-state mems step";
  r.unit = "ms/step";
  Interleave(
      z.reps, [&] { return EngineSteps(one, z.engine_batch); },
      [&] { return HiddenStateSteps(mems, z.baseline_batch); }, &r.a_reps, &r.b_reps);
  r.a = Median(r.a_reps);
  r.b = Median(r.b_reps);
  r.ratio = r.b / r.a;
  r.target = 15;
  return r;
}

// P1f: the engine step vs the bytes it must read at the measured bandwidth.
Row Bench::BandwidthFloorRow(const std::vector<SessionState*>& one) {
  const Sizes& z = sizes_;
  const int64_t mem = z.mem;
  // Bandwidth: a reduction over a 512 MB float tensor (64 MB in quick mode),
  // with the model's thread count, interleaved with the engine step.
  const int64_t probe_bytes = quick_ ? (64ll << 20) : (512ll << 20);
  at::Tensor probe = at::ones({probe_bytes / 4}, at::TensorOptions().device(device_));
  BandwidthPass(probe, 1);
  Progress("P1f: bandwidth floor");
  Row f;
  f.id = "P1f";
  const bool reduced = dtype_ != txl::WeightDtype::kFloat32 || kv_dtype_ != txl::KvDtype::kFloat32;
  const int64_t weight_bytes = dtype_ == txl::WeightDtype::kFloat32 ? 4 : dtype_ == txl::WeightDtype::kBfloat16 ? 2 : 1;
  const int64_t floor_bytes =
      reduced ? ReducedFloorBytes(mem, weight_bytes, kv_dtype_ == txl::KvDtype::kFloat32 ? 4 : 2) : FloorBytes(mem);
  f.measurement =
      absl::StrFormat("engine step vs bandwidth floor (%.1f MB read per step / measured bandwidth)", floor_bytes / 1e6);
  f.a_name = "engine step";
  f.b_name = "floor";
  f.unit = "ms/step";
  std::vector<double> pass;
  Interleave(
      z.reps, [&] { return EngineSteps(one, z.engine_batch); }, [&] { return BandwidthPass(probe, 3); }, &f.a_reps,
      &pass);
  for (double p : pass) f.b_reps.push_back(floor_bytes * p / probe_bytes);
  f.a = Median(f.a_reps);
  f.b = Median(f.b_reps);
  f.ratio = f.a / f.b;
  f.target = 1.25;
  f.at_least = false;
  const double bw = probe_bytes / Median(pass);
  const int64_t engine_bytes = FloorBytesWithoutPositions(mem) + RelTableBytes(mem + 1);
  f.extra = {{"floor_bytes", floor_bytes},
             {"position_term_bytes", PositionTermBytes(mem + 1)},
             {"bandwidth_bytes_per_s", bw},
             {"bandwidth_probe_bytes", probe_bytes},
             {"rel_table_bytes_read", RelTableBytes(mem + 1)},
             {"engine_bytes_read", engine_bytes},
             {"step_over_engine_bytes", f.a / (engine_bytes / bw)},
             {"step_over_floor_without_positions", f.a / (FloorBytesWithoutPositions(mem) / bw)}};
  const double same = SameSizeFloor(floor_bytes);
  f.extra["same_size_floor_s"] = same;
  f.extra["step_over_same_size_floor"] = f.a / same;
  return f;
}

// ---- S: scoring segments, N sessions per step vs one.
Row Bench::ScoreRow() {
  const Sizes& z = sizes_;
  const int64_t seg = quick_ ? 16 : 64, window = quick_ ? 64 : 640;
  const int N = z.sessions;
  Progress(absl::StrFormat("S: scoring %d-token segments, %d sessions", seg, N));
  std::vector<std::unique_ptr<SessionState>> sessions;
  std::vector<SessionState*> all;
  for (int i = 0; i < N; ++i) {
    sessions.push_back(FullSession(window, 300 + i));
    all.push_back(sessions.back().get());
  }
  std::vector<SessionState*> one = {all[0]};
  ScoreSteps(all, 1, seg);  // warm-up
  Row r;
  r.id = "S";
  r.measurement = absl::StrFormat("scoring %d-token segments, window %d: aggregate tokens/s, %d sessions per step vs 1",
                                  seg, window, N);
  r.a_name = absl::StrFormat("%d sessions", N);
  r.b_name = "1 session";
  r.unit = "tokens/s";
  std::vector<double> a_sec, b_sec;
  Interleave(
      z.reps, [&] { return ScoreSteps(all, z.multi_batch, seg); }, [&] { return ScoreSteps(one, z.engine_batch, seg); },
      &a_sec, &b_sec);
  for (double t : a_sec) r.a_reps.push_back(N * seg / t);
  for (double t : b_sec) r.b_reps.push_back(seg / t);
  r.a = Median(r.a_reps);
  r.b = Median(r.b_reps);
  r.ratio = r.a / r.b;
  r.target = 1;
  r.extra = {{"step_seconds_batch", a_sec},
             {"step_seconds_1", b_sec},
             {"published",
              "NVIDIA DeepLearningExamples Transformer-XL base, 1x A100 40GB, tgt_len 64, "
              "mem_len 640: TorchScript FP16 6,936 tokens/s at batch 1 and 107,082 at batch 32; "
              "TF32 6,085 and 71,124"}};
  return r;
}

// ---- P2: the engine step vs recomputing the whole window `w`.
Row Bench::RecomputeRow(int64_t w) {
  const Sizes& z = sizes_;
  Progress(absl::StrFormat("P2: recompute, window %d", w));
  auto s = FullSession(w, 2);
  std::vector<SessionState*> one = {s.get()};
  const std::vector<int> toks = RandomTokens(w, 5);
  at::Tensor window =
      at::tensor(std::vector<int64_t>(toks.begin(), toks.end()), at::kLong).view({w, 1}).to(at::Device(device_));
  EngineSteps(one, 2);
  const int reps = w > 2000 ? std::max(2, std::min(z.reps, 3)) : z.reps;
  Row r;
  r.id = absl::StrFormat("P2-%d", w);
  r.measurement = absl::StrFormat("1 session, window %d: engine step vs recompute the window (a)", w);
  r.a_name = "engine step";
  r.b_name = "recompute";
  r.unit = "ms/step";
  Interleave(
      reps, [&] { return EngineSteps(one, z.engine_batch); }, [&] { return RecomputeSteps(window, 1); }, &r.a_reps,
      &r.b_reps);
  r.a = Median(r.a_reps);
  r.b = Median(r.b_reps);
  r.ratio = r.b / r.a;
  r.target = w > 2000 ? 250 : 100;
  return r;
}

// A row from per-repetition seconds: ratio a/b (or b/a for at_least rows
// measured in seconds, i.e. speed-ups).
Row Bench::Ratio(std::string id, std::string measurement, std::string a_name, std::string b_name,
                 const std::vector<double>& a_sec, const std::vector<double>& b_sec, double target, bool speedup) {
  Row r;
  r.id = std::move(id);
  r.measurement = std::move(measurement);
  r.a_name = std::move(a_name);
  r.b_name = std::move(b_name);
  r.unit = "ms/step";
  r.a_reps = a_sec;
  r.b_reps = b_sec;
  r.a = Median(a_sec);
  r.b = Median(b_sec);
  r.ratio = speedup ? r.b / r.a : r.a / r.b;
  r.target = target;
  r.at_least = speedup;
  return r;
}

// A bf16-vs-float32 tokens/s row from per-repetition seconds per step
// (or per token) of `tokens` tokens.
Row Bench::Throughput(std::string id, std::string measurement, const std::vector<double>& bf_sec,
                      const std::vector<double>& f32_sec, double tokens, double target) {
  Row r;
  r.id = std::move(id);
  r.measurement = std::move(measurement);
  r.a_name = "bf16";
  r.b_name = "float32";
  r.unit = "tokens/s";
  for (double t : bf_sec) r.a_reps.push_back(tokens / t);
  for (double t : f32_sec) r.b_reps.push_back(tokens / t);
  r.a = Median(r.a_reps);
  r.b = Median(r.b_reps);
  r.ratio = r.a / r.b;
  r.target = target;
  return r;
}

}  // namespace engine_bench
