// IncrementalModel's decode graphs: a decode step padded to a DecodeBucket,
// its metadata copied into the bucket's static buffer, and on a GPU the
// pass captured once per bucket and replayed (docs/MODEL.md, "Decode
// graphs"). Padding sessions feed token 0 with no memory: they gather only
// the pool's padding row, write their keys to its discard row, and their
// outputs are dropped.
#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "model/net/incremental.h"
#include "model/net/incremental_pass.h"

namespace txl {

bool IncrementalModel::GraphEligible(const std::vector<Pending*>& batch,
                                     const std::vector<std::vector<int64_t>>& tokens, const RingBackup& backup) const {
  if (!decode_graphs_ || pool_ == nullptr || batch.empty()) return false;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Pending* p = batch[b];
    // One token, after a memory that the pool holds and keeps (a window of
    // one holds nothing) and that this step has not replaced.
    const SessionMemory* m = p->memory;
    if (tokens[b].size() != 1 || p->replaced() || m->mem_len() <= 1 || m->pool_ != pool_) return false;
    // Its key goes to position p->position's slot, which held committed
    // position p->position - mem_len unless that is before the step's first.
    const bool overwrites = p->position - m->mem_len_ >= m->position_ - m->length_;
    if (overwrites && !backup.Holds(m)) return false;
  }
  return true;
}

at::Tensor IncrementalModel::GraphDecodePass(std::vector<Pending*>& batch,
                                             const std::vector<std::vector<int64_t>>& tokens) {
  const int64_t B = static_cast<int64_t>(batch.size());
  int64_t keys = 0;
  for (const Pending* p : batch) keys = std::max(keys, p->length + 1);
  const DecodeBucket bucket = DecodeBucket::For(B, keys);
  const int64_t Bp = bucket.sessions, Kp = bucket.keys;

  // The padded geometry: every session feeds one token in place.
  PassGeometry g;
  g.B = Bp;
  g.T = Bp;
  g.N = 1;
  g.Kmax = Kp;
  g.D = Kp;  // distances past a session's window are masked, so a larger table changes nothing
  g.n.assign(Bp, 1);
  g.m.assign(Bp, 0);
  g.M.assign(Bp, 1);
  g.K.assign(Bp, 1);
  g.flat.assign(Bp, 0);
  g.in_place.assign(Bp, 1);
  PoolPlan plan;
  plan.gather = true;
  plan.gather_rows.assign(Bp * Kp, SlotPool::kPadRow);
  plan.write_rows.assign(Bp, SlotPool::kDiscardRow);
  plan.write_tok.resize(Bp);
  for (int64_t b = 0; b < Bp; ++b) plan.write_tok[b] = b;
  for (int64_t b = 0; b < B; ++b) {
    const Pending* p = batch[b];
    g.flat[b] = tokens[b][0];
    g.m[b] = p->length;
    g.M[b] = p->memory->mem_len();
    g.K[b] = p->length + 1;
    const std::vector<int64_t> held = PoolRows(*p->memory, p->position - p->length, p->length + 1);
    std::copy(held.begin(), held.end(), plan.gather_rows.begin() + b * Kp);
    plan.write_rows[b] = held.back();
  }

  // Captures hold the pool's and the table's addresses.
  EnsureRelTable(Kp);
  if (pool_.get() != graphs_pool_ || pool_->generation() != graphs_pool_generation_ || rel_size_ != graphs_rel_size_) {
    graphs_.clear();
    graphs_pool_ = pool_.get();
    graphs_pool_generation_ = pool_->generation();
    graphs_rel_size_ = rel_size_;
  }
  const std::vector<int64_t> values = PackMeta(g, plan);
  const int64_t count = static_cast<int64_t>(values.size());
  DecodeGraph& graph = graphs_[bucket];
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  if (!graph.meta.defined()) graph.meta = at::empty({count}, lopt.device(device_));
  if (device_.is_cpu()) {
    std::memcpy(graph.meta.data_ptr<int64_t>(), values.data(), count * sizeof(int64_t));
  } else {  // from pinned memory, queued on the stream the pass runs on
    at::Tensor host = at::empty({count}, lopt.pinned_memory(true));
    std::memcpy(host.data_ptr<int64_t>(), values.data(), count * sizeof(int64_t));
    graph.meta.copy_(host, /*non_blocking=*/true);
  }
  const std::vector<Pending*> none;  // a padded pass reads no session's host state
  auto body = [&]() {
    std::vector<std::vector<at::Tensor>> new_k(Bp), new_v(Bp);  // stay empty: every write is in place
    return Layers(none, g, plan, DeriveMeta(g, plan, graph.meta), new_k, new_v);
  };
  ++graph_counts_.padded;
  at::Tensor x;
  if (!CapturedPass::Capturable(device_)) {
    x = body();
  } else if (graph.captured == nullptr) {
    const CapturedPass* share = nullptr;
    for (const auto& [other, held] : graphs_) {
      if (held.captured != nullptr) share = held.captured.get();
    }
    try {
      graph.captured = CapturedPass::Capture(std::function<at::Tensor()>(body), &x, share);
      ++graph_counts_.captured;
    } catch (const c10::Error& e) {
      // Graphs off for good (KernelPath says why); this step runs eagerly.
      // Its writes to the pool repeat the warm-up's, with the same values.
      graph_error_ = e.what_without_backtrace();
      decode_graphs_ = false;
      x = body();
      graphs_.clear();
    }
  } else {
    x = graph.captured->Replay().clone();
    ++graph_counts_.replayed;
  }
  for (int64_t b = 0; b < B; ++b) batch[b]->length = std::min(g.M[b] - 1, batch[b]->length + 1);
  return x.slice(0, 0, B);
}

}  // namespace txl
