// engine_bench: group Q, reduced precision (model/precision.h) against
// float32 on the same weights and threads, every measurement interleaved:
// one session (Q1, Q1f, Q5), a 2048-token prefill (Q4), 32 sessions (Q3, Q3f).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/engine_bench.h"
#include "model/kernels/cpu_isa.h"
#include "model/kernels/decode_kernels.h"

namespace engine_bench {
namespace {

// Q4's ceiling: GFLOP/s of the products a prefill runs (PackedProduct over
// every panel, each thread a range of x's rows, as IncrementalModel::Product
// calls it), for a [T, cols] input against a [rows, cols] matrix of `elem`
// (int8: as int8 products where the CPU runs them): median of `reps`.
double ProductGflops(txl::Elem elem, int64_t T, int64_t rows, int64_t cols, int reps) {
  const at::Tensor x = at::randn({T, cols});
  const at::Tensor w = elem == txl::Elem::kBf16 ? at::randn({rows, cols}).to(at::kBFloat16)
                       : elem == txl::Elem::kI8 ? at::randint(-127, 128, {rows, cols}, at::kChar)
                                                : at::randn({rows, cols});
  const at::Tensor scale = at::full({rows}, 0.01f);
  at::Tensor packed = at::empty({txl::PackedSize(rows, cols, elem)}, w.scalar_type());
  txl::WeightMatrix m;
  m.data = w.data_ptr();
  m.elem = elem;
  m.ld = cols;
  const bool int8_products = elem == txl::Elem::kI8 && txl::CpuRunsInt8Dot(txl::KernelIsa::kBest);
  txl::PackPanels(m, rows, cols, packed.data_ptr(), int8_products);
  txl::PackedMatrix pm;
  pm.data = packed.data_ptr();
  pm.elem = elem;
  pm.scale = scale.data_ptr<float>();
  pm.rows = rows;
  pm.cols = cols;
  pm.bf16_products = elem == txl::Elem::kBf16 && txl::CpuHasBf16Products();
  pm.int8_products = int8_products;
  at::Tensor y = at::empty({T, rows});
  std::vector<double> seconds;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    const auto start = Clock::now();
    at::parallel_for(0, (T + 15) / 16, 1, [&](int64_t begin, int64_t end) {
      const int64_t r0 = begin * 16, r1 = std::min(T, end * 16);
      txl::PackedProduct(pm, x.data_ptr<float>() + r0 * cols, r1 - r0, nullptr, false, y.data_ptr<float>() + r0 * rows,
                         0, (rows + txl::kPanel - 1) / txl::kPanel);
    });
    if (r > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 2.0 * T * rows * cols / Median(seconds) / 1e9;
}

}  // namespace

void Bench::QRows(std::vector<Row>* rows) {
  const Sizes& z = sizes_;
  const int64_t mem = z.mem;
  using txl::KvDtype;
  using txl::WeightDtype;
  Progress("Q: loading bfloat16 and int8 models");
  auto bf = Load(WeightDtype::kBfloat16, KvDtype::kBfloat16);
  auto i8 = Load(WeightDtype::kInt8, KvDtype::kBfloat16);
  Progress("Q: kernels " + bf->KernelPath());
  Progress("Q: kernels " + i8->KernelPath());
  LanguageModel* f32 = lm_.get();

  // One session each, full window; the hidden-state baseline; bandwidth.
  auto s32 = FullSession(mem + 1, 31, f32), sbf = FullSession(mem + 1, 31, bf.get()),
       si8 = FullSession(mem + 1, 31, i8.get());
  std::vector<SessionState*> o32 = {s32.get()}, obf = {sbf.get()}, oi8 = {si8.get()};
  std::vector<at::Tensor> mems;
  at::manual_seed(3);
  for (int64_t l = 0; l < config_.n_layer; ++l)
    mems.push_back(at::randn({mem, 1, config_.d_model}, at::TensorOptions().device(device_)));
  const int64_t probe_bytes = quick_ ? (64ll << 20) : (512ll << 20);
  at::Tensor probe = at::ones({probe_bytes / 4});
  for (auto* one : {&o32, &obf, &oi8}) EngineSteps(*one, 2, one == &o32 ? f32 : one == &obf ? bf.get() : i8.get());
  HiddenStateSteps(mems, 1);
  BandwidthPass(probe, 1);
  Progress("Q1: one session per precision, interleaved");
  std::vector<double> t32, tbf, ti8, base, pass;
  for (int r = 0; r < z.reps; ++r) {
    t32.push_back(EngineSteps(o32, z.engine_batch, f32));
    tbf.push_back(EngineSteps(obf, z.engine_batch, bf.get()));
    ti8.push_back(EngineSteps(oi8, z.engine_batch, i8.get()));
    base.push_back(HiddenStateSteps(mems, z.baseline_batch));
    pass.push_back(BandwidthPass(probe, 3));
  }
  const std::string m = absl::StrFormat("1 session, memory %d", mem);
  rows->push_back(Ratio("Q1-bf16", m + ": bf16 weights + bf16 memories step vs float32 step", "bf16 step",
                        "float32 step", tbf, t32, 0.55, false));
  rows->push_back(Ratio("Q1-int8", m + ": int8 weights + bf16 memories step vs float32 step", "int8 step",
                        "float32 step", ti8, t32, 0.40, false));
  const double bw = probe_bytes / Median(pass);
  for (auto [id, t, wb] : {std::tuple{"Q1f-bf16", &tbf, int64_t{2}}, std::tuple{"Q1f-int8", &ti8, int64_t{1}}}) {
    const int64_t bytes = ReducedFloorBytes(mem, wb, 2);
    std::vector<double> floor;
    for (double p : pass) floor.push_back(bytes * p / probe_bytes);
    Row f =
        Ratio(id, absl::StrFormat("%s step vs its bandwidth floor (%.1f MB / measured bandwidth)", id + 4, bytes / 1e6),
              "step", "floor", *t, floor, 1.25, false);
    const double same = SameSizeFloor(bytes);
    f.extra = {{"floor_bytes", bytes},
               {"bandwidth_bytes_per_s", bw},
               {"same_size_floor_s", same},
               {"step_over_same_size_floor", f.a / same}};
    rows->push_back(f);
  }
  rows->push_back(Ratio("Q5-bf16", m + ": bf16 step vs hidden-state memory (the original code's speed)", "bf16 step",
                        "hidden-state mems step", tbf, base, 20, true));
  rows->push_back(Ratio("Q5-int8", m + ": int8 step vs hidden-state memory (the original code's speed)", "int8 step",
                        "hidden-state mems step", ti8, base, 30, true));
  rows->back().extra = {{"float32_step_over_baseline", Median(base) / Median(t32)}};

  // Prefill: a 2048-token input into a fresh session (window mem + 1).
  rows->push_back(PrefillRow(f32, bf.get()));

  // 32 sessions per step, aggregate tokens/s.
  ManySessionRows(f32, bf.get(), probe, probe_bytes, rows);
}

// Q4: prefill tokens/s of a 2048-token input (64 quick), bf16 vs float32.
Row Bench::PrefillRow(LanguageModel* f32, LanguageModel* bf) {
  const Sizes& z = sizes_;
  const int64_t mem = z.mem;
  const int64_t prefill = quick_ ? 64 : 2048;
  const std::vector<int> input = RandomTokens(prefill, 77);
  auto Prefill = [&](LanguageModel* lm) {
    auto s = Must(lm->NewSession(mem + 1), "new session");
    std::vector<StepInput> in(1);
    in[0].session = s.get();
    in[0].tokens = input;
    in[0].want_last_distribution = true;
    const auto start = Clock::now();
    auto out = Must(lm->Step(absl::MakeSpan(in)), "prefill");
    sink_ += out[0].last_distribution[0];
    return std::chrono::duration<double>(Clock::now() - start).count() / prefill;
  };
  Prefill(f32);
  Prefill(bf);
  Progress(absl::StrFormat("Q4: prefill of %d tokens", prefill));
  std::vector<double> p32, pbf;
  Interleave(
      z.reps, [&] { return Prefill(f32); }, [&] { return Prefill(bf); }, &p32, &pbf);
  // The target: 3x where AMX's tiles run the bfloat16 products, 2.5x on
  // AVX-512-BF16 (or less) alone.
  const bool amx = txl::CpuHasAmx();
  Row q4 = Throughput("Q4",
                      absl::StrFormat("prefill of a %d-token input (window %d): bf16 vs float32 (%s)", prefill, mem,
                                      amx ? "AMX" : "no AMX"),
                      pbf, p32, 1, amx ? 3 : 2.5);
  // The products alone, bfloat16 against float32 on the same kernels: what
  // the instruction set allows the ratio (on AVX-512-BF16 one VDPBF16PS
  // does twice the multiply-adds of an FMA; docs/PERFORMANCE.md, "The AMD
  // EPYC table").
  const double gbf = ProductGflops(txl::Elem::kBf16, prefill, config_.d_inner, config_.d_model, z.reps);
  const double g32 = ProductGflops(txl::Elem::kF32, prefill, config_.d_inner, config_.d_model, z.reps);
  const double gi8 = ProductGflops(txl::Elem::kI8, prefill, config_.d_inner, config_.d_model, z.reps);
  q4.measurement += absl::StrFormat("; the products alone: bf16 %.0f vs float32 %.0f GFLOP/s (%.2fx; int8 %.0f)", gbf,
                                    g32, gbf / g32, gi8);
  q4.extra = {{"kernels", bf->KernelPath()},
              {"product_gflops_bf16", gbf},
              {"product_gflops_float32", g32},
              {"product_gflops_int8", gi8},
              {"int8_products", txl::CpuRunsInt8Dot(txl::KernelIsa::kBest)},
              {"product_ratio", gbf / g32}};
  return q4;
}

// N sessions of `lm`, each window filled by stepping, 4 sessions per step.
std::vector<std::unique_ptr<SessionState>> Bench::FilledSessions(LanguageModel* lm) {
  const int N = sizes_.sessions;
  const int64_t mem = sizes_.mem;
  std::vector<std::unique_ptr<SessionState>> out;
  for (int i = 0; i < N; i += 4) {
    std::vector<StepInput> in;
    for (int j = i; j < std::min(N, i + 4); ++j) {
      out.push_back(Must(lm->NewSession(mem + 1), "new session"));
      StepInput x;
      x.session = out.back().get();
      x.tokens = RandomTokens(mem, 300 + j);
      in.push_back(std::move(x));
    }
    Must(lm->Step(absl::MakeSpan(in)), "filling sessions");
  }
  return out;
}

// Q3: N sessions per step, aggregate tokens/s, bf16 vs float32; then Q3f.
void Bench::ManySessionRows(LanguageModel* f32, LanguageModel* bf, const at::Tensor& probe, int64_t probe_bytes,
                            std::vector<Row>* rows) {
  const Sizes& z = sizes_;
  const int N = z.sessions;
  Progress(absl::StrFormat("Q3: %d sessions per precision", N));
  auto many32 = FilledSessions(f32), manybf = FilledSessions(bf);
  std::vector<SessionState*> a32, abf;
  for (auto& s : many32) a32.push_back(s.get());
  for (auto& s : manybf) abf.push_back(s.get());
  EngineSteps(a32, 1, f32);
  EngineSteps(abf, 1, bf);
  // The probe pass interleaved too, for Q3f's floors below.
  std::vector<double> m32, mbf, mpass;
  for (int r = 0; r < z.reps; ++r) {
    mbf.push_back(EngineSteps(abf, z.multi_batch, bf));
    m32.push_back(EngineSteps(a32, z.multi_batch, f32));
    mpass.push_back(BandwidthPass(probe, 3));
  }
  Row q3 = Throughput(
      "Q3", absl::StrFormat("aggregate tokens/s, %d sessions per step (memory %d): bf16 vs float32", N, z.mem), mbf,
      m32, N, 1.8);
  q3.extra = {{"memory_bytes_per_session_bf16", manybf[0]->memory_bytes()},
              {"memory_bytes_per_session_float32", many32[0]->memory_bytes()}};
  rows->push_back(q3);
  ManySessionFloorRows(mbf, m32, mpass, probe_bytes, rows);
}

// Q3f: each N-session step against the bytes it must read (the weights
// once, every session's keys and values), at the probe's DRAM rate. Both
// steps are bound by these bytes, so Q3 cannot exceed the floors' ratio.
void Bench::ManySessionFloorRows(const std::vector<double>& mbf, const std::vector<double>& m32,
                                 const std::vector<double>& mpass, int64_t probe_bytes, std::vector<Row>* rows) {
  const int N = sizes_.sessions;
  const int64_t mem = sizes_.mem;
  const int64_t kv32 = config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4;
  const int64_t floor32 = FloorBytes(mem) + (N - 1) * kv32;
  const int64_t floorbf = ReducedFloorBytes(mem, 2, 2) + (N - 1) * kv32 / 2;
  for (auto [id, t, bytes] : {std::tuple{"Q3f-bf16", &mbf, floorbf}, std::tuple{"Q3f-float32", &m32, floor32}}) {
    std::vector<double> floor;
    for (double p : mpass) floor.push_back(bytes * p / probe_bytes);
    Row f = Ratio(id,
                  absl::StrFormat("%d-session %s step vs its bandwidth floor (%.1f MB / measured bandwidth)", N, id + 4,
                                  bytes / 1e6),
                  "step", "floor", *t, floor, 1.25, false);
    f.extra = {{"floor_bytes", bytes},
               {"bandwidth_bytes_per_s", probe_bytes / Median(mpass)},
               {"q3_ceiling_floor_ratio", static_cast<double>(floor32) / floorbf}};
    rows->push_back(f);
  }
}

}  // namespace engine_bench
