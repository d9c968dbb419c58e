// engine_bench: what an engine step is compared with. The original code's
// ways of serving the same prediction (hidden-state memory, recomputing the
// window), and the bandwidth floor: the bytes a step must read, and the time
// a reduction takes to read them.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "bench/engine_bench.h"
#include "model/net/txl_math.h"
#include "model/net/weights.h"
#include "train/training_forward.h"

namespace engine_bench {

// The original code's step: hidden-state mems of every layer, the new
// token's segment forward (keys/values of the whole memory projected
// again, mems updated), then the output softmax for that token.
double Bench::HiddenStateSteps(const std::vector<at::Tensor>& mems, int n) {
  txl::ModelConfig c = config_;
  c.mem_len = mems[0].size(0) + 1;  // every memory position is attended, as in the engine
  c.same_length = true;
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(device_);
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    c10::InferenceMode guard;
    at::Tensor tok = at::full({1, 1}, (counter_++ * 7919) % config_.n_token, lopt);
    txl::SegmentOutput seg = txl::TrainingForward(c, weights_, tok, mems, /*train=*/false);
    at::Tensor lp = txl::LogProbs(c, weights_, seg.hidden.view({1, c.d_model})).to(at::kCPU).contiguous();
    std::vector<float> dist(lp.data_ptr<float>(), lp.data_ptr<float>() + c.n_token);
    sink_ += dist[0] + seg.mems[0].size(0);
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / n;
}

// Vanilla: the whole window through the model, no memory; the last
// position's distribution.
double Bench::RecomputeSteps(const at::Tensor& window_tokens, int n) {
  txl::ModelConfig c = config_;
  c.mem_len = window_tokens.size(0);
  c.same_length = true;
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    c10::InferenceMode guard;
    txl::SegmentOutput seg = txl::TrainingForward(c, weights_, window_tokens, {}, /*train=*/false);
    at::Tensor last = seg.hidden.select(0, seg.hidden.size(0) - 1);  // [1, d]
    at::Tensor lp = txl::LogProbs(c, weights_, last).to(at::kCPU).contiguous();
    std::vector<float> dist(lp.data_ptr<float>(), lp.data_ptr<float>() + c.n_token);
    sink_ += dist[0];
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / n;
}

// Seconds per byte-read pass of `probe` (a timed reduction).
double Bench::BandwidthPass(const at::Tensor& probe, int n) {
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    c10::InferenceMode guard;
    sink_ += probe.sum().item<float>();
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / n;
}

// Seconds to read `bytes` from a buffer of that size, again and again: the
// floor when a step's working set stays (partly) in a large last-level
// cache, which the 512 MB probe's DRAM figure does not see.
double Bench::SameSizeFloor(int64_t bytes) {
  at::Tensor probe = at::ones({bytes / 4});
  BandwidthPass(probe, 2);
  std::vector<double> passes;
  for (int r = 0; r < 5; ++r) passes.push_back(BandwidthPass(probe, 3));
  return Median(passes);
}

// The same floor for reduced precision: the layers' product matrices at
// `weight_bytes` per element (int8: plus a float scale per row), keys and
// values at `kv_bytes`, the position term at 2 bytes (the engine's table
// is bfloat16 then; r_net at the weights' width). Everything else float32.
int64_t Bench::ReducedFloorBytes(int64_t mem, int64_t weight_bytes, int64_t kv_bytes) const {
  int64_t total = FloorBytes(mem);
  int64_t r_net = 0;
  for (const txl::LayerWeights& L : weights_.layers) {
    for (const at::Tensor* t : {&L.qkv_w, &L.o_w, &L.ff1_w, &L.ff2_w}) {
      total -= t->numel() * (4 - weight_bytes);
      if (weight_bytes == 1) total += t->size(0) * 4;
    }
    r_net += L.r_w.numel() * weight_bytes;
  }
  total -= config_.n_layer * 2 * mem * config_.n_head * config_.d_head * (4 - kv_bytes);
  total -= PositionTermBytes(mem + 1);
  return total + std::min(r_net, RelTableBytes(mem + 1) / 2);
}

// The position scores (q + v) . W_r R(d) need, for every layer, either
// r_net's weights W_r (the product formed per step) or a table of W_r R(d)
// over the window (the engine's choice: less compute); no exact step reads
// neither, so the floor counts the smaller.
int64_t Bench::PositionTermBytes(int64_t window) const {
  int64_t r_net = 0;
  for (const txl::LayerWeights& L : weights_.layers) r_net += L.r_w.numel() * L.r_w.element_size();
  return std::min(r_net, RelTableBytes(window));
}

int64_t Bench::FloorBytesWithoutPositions(int64_t mem) const {
  auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; };
  int64_t total = 0;
  for (const txl::LayerWeights& L : weights_.layers) {
    for (const at::Tensor* t :
         {&L.qkv_w, &L.o_w, &L.attn_ln_w, &L.attn_ln_b, &L.ff1_w, &L.ff1_b, &L.ff2_w, &L.ff2_b, &L.ff_ln_w, &L.ff_ln_b})
      total += bytes(*t);
  }
  for (const auto& t : weights_.out_w) total += bytes(t);
  for (const auto& t : weights_.out_b) total += bytes(t);
  for (const auto& t : weights_.out_projs) total += bytes(t);
  total += bytes(weights_.cluster_w) + bytes(weights_.cluster_b);
  total += 2 * config_.n_head * config_.d_head * 4 * config_.n_layer;        // u, v biases (upper bound)
  total += config_.embed_dim() * 4;                                          // one embedding row
  total += config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4;  // K/V
  return total;
}

}  // namespace engine_bench
