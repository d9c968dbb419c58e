// IncrementalModel's graphs: a decode step, or a small pass of several
// tokens a session, padded to a DecodeBucket, its metadata copied into the
// bucket's static buffer, and on a GPU the pass captured once per bucket and
// replayed (docs/MODEL.md, "Decode graphs" and "Small multi-token passes,
// padded too"). Padding sessions feed token 0 with no memory: they gather
// only the pool's padding row, write their keys to its discard row, and
// their outputs are dropped.
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
    // Its key goes to position p->position's slot, which held position
    // p->position - mem_len: committed if within [first, position_).
    const int64_t held_there = p->position - m->mem_len_;
    const bool overwrites = held_there >= m->position_ - m->length_ && held_there < m->position_;
    if (overwrites && !backup.Holds(m)) return false;
  }
  return true;
}

std::pair<IncrementalModel::PassGeometry, IncrementalModel::PoolPlan> IncrementalModel::Padded(
    const DecodeBucket& bucket) {
  const int64_t Bp = bucket.sessions, Np = bucket.tokens, Kp = bucket.keys, T = Bp * Np;
  PassGeometry g;
  g.B = Bp;
  g.T = T;
  g.N = Np;
  g.Kmax = Kp;
  g.D = Kp;  // distances past a session's window are masked, so a larger table changes nothing
  g.n.assign(Bp, 1);
  g.m.assign(Bp, 0);
  g.M.assign(Bp, 1);
  g.K.assign(Bp, 1);
  g.flat.assign(T, 0);
  g.in_place.assign(Bp, 1);
  PoolPlan plan;
  plan.gather = true;
  plan.gather_rows.assign(Bp * Kp, SlotPool::kPadRow);
  plan.write_rows.assign(T, SlotPool::kDiscardRow);
  plan.write_tok.resize(T);
  for (int64_t t = 0; t < T; ++t) plan.write_tok[t] = t;
  return {std::move(g), std::move(plan)};
}

at::Tensor IncrementalModel::GraphDecodePass(std::vector<Pending*>& batch,
                                             const std::vector<std::vector<int64_t>>& tokens) {
  const int64_t B = static_cast<int64_t>(batch.size());
  int64_t keys = 0;
  for (const Pending* p : batch) keys = std::max(keys, p->length + 1);
  const DecodeBucket bucket = DecodeBucket::For(B, keys);
  const int64_t Kp = bucket.keys;

  // The padded geometry: every session feeds one token in place.
  auto [g, plan] = Padded(bucket);
  for (int64_t b = 0; b < B; ++b) {
    const Pending* p = batch[b];
    g.flat[b] = tokens[b][0];
    g.m[b] = p->length;
    g.M[b] = p->memory->mem_len();
    g.K[b] = p->length + 1;
    int64_t* held = plan.gather_rows.data() + b * Kp;
    PoolRows(*p->memory, p->position - p->length, p->length + 1, held);
    plan.write_rows[b] = held[p->length];
  }

  EnsureRelTable(Kp);
  const at::Tensor x = RunPadded(bucket, g, plan);
  for (int64_t b = 0; b < B; ++b) batch[b]->length = std::min(g.M[b] - 1, batch[b]->length + 1);
  return x.slice(0, 0, B);
}

bool IncrementalModel::PassGraphEligible(const std::vector<Pending*>& batch,
                                         const std::vector<std::vector<int64_t>>& tokens,
                                         const RingBackup& backup) const {
  if (!pass_graphs_ || pool_ == nullptr || batch.empty()) return false;
  int64_t most = 0, held = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Pending* p = batch[b];
    const SessionMemory* m = p->memory;
    const int64_t n = static_cast<int64_t>(tokens[b].size());
    if (n == 0 || p->replaced() || m->pool_ != pool_) return false;
    // Position q goes to the slot of q - mem_len: committed positions
    // [first, position_) in [p - M, p + n - M) are overwritten.
    const int64_t M = m->mem_len_, first = m->position_ - m->length_;
    const bool overwrites = M > 1 && std::max(first, p->position - M) < std::min(m->position_, p->position + n - M);
    if (overwrites && !backup.Holds(m)) return false;
    most = std::max(most, n);
    held = std::max(held, p->length);
  }
  if (most < 2) return false;  // a decode step: GraphEligible's, or Pass
  const DecodeBucket bucket = DecodeBucket::ForPass(static_cast<int64_t>(batch.size()), most, held);
  const int64_t tokens_padded = bucket.sessions * bucket.tokens;
  if (tokens_padded > kPassGraphTokens || tokens_padded * config_.n_head * bucket.keys > kPassGraphScores) return false;
  if (const auto held = graphs_.find(bucket); held != graphs_.end()) return !held->second.warm_up_failed;
  const int64_t pass_buckets =
      std::count_if(graphs_.begin(), graphs_.end(), [](const auto& held) { return held.first.tokens > 1; });
  return pass_buckets < kPassGraphBuckets;
}

// Padding sessions feed token 0 with no memory; padding tokens (beyond a
// session's own) are laid over its block past its keys, where the mask hides
// them, and written to the discard row. Every new key is laid over the
// gathered block and written after the gather, as in Pass (PoolPlan).
at::Tensor IncrementalModel::GraphPass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens) {
  const int64_t B = static_cast<int64_t>(batch.size());
  int64_t most = 0, held = 0;
  for (int64_t b = 0; b < B; ++b) {
    most = std::max(most, static_cast<int64_t>(tokens[b].size()));
    held = std::max(held, batch[b]->length);
  }
  const DecodeBucket bucket = DecodeBucket::ForPass(B, most, held);
  const int64_t Bp = bucket.sessions, Np = bucket.tokens, Kp = bucket.keys, T = Bp * Np;

  auto [g, plan] = Padded(bucket);
  plan.write_after_gather = true;
  plan.patch_tok = plan.write_tok;
  plan.patch_rows.resize(T);
  for (int64_t b = 0; b < Bp; ++b) {
    const int64_t m = b < B ? batch[b]->length : 0;
    for (int64_t i = 0; i < Np; ++i) plan.patch_rows[b * Np + i] = b * Kp + m + i;
  }
  std::vector<int64_t> rows;  // the real tokens' rows of the padded pass
  int64_t widest = 1;         // the most distances a session attends: its window, or its keys
  for (int64_t b = 0; b < B; ++b) {
    const Pending* p = batch[b];
    const int64_t n = static_cast<int64_t>(tokens[b].size()), m = p->length, M = p->memory->mem_len();
    g.n[b] = n;
    g.m[b] = m;
    g.M[b] = M;
    g.K[b] = m + n;
    std::copy(tokens[b].begin(), tokens[b].end(), g.flat.begin() + b * Np);
    PoolRows(*p->memory, p->position - m, m, plan.gather_rows.data() + b * Kp);
    const int64_t kept = M > 1 ? std::min(n, std::min(M - 1, m + n)) : 0;
    PoolRows(*p->memory, p->position + n - kept, kept, plan.write_rows.data() + b * Np + (n - kept));
    for (int64_t i = 0; i < n; ++i) rows.push_back(b * Np + i);
    widest = std::max(widest, std::min(M, m + n));
  }
  // The table as Pass grows it (not to the padded keys); distances past a
  // window are masked. Constant per bucket until the table is rebuilt,
  // which drops the captures.
  EnsureRelTable(widest);
  g.D = std::min(Kp, rel_size_);
  const at::Tensor x = RunPadded(bucket, g, plan);
  for (int64_t b = 0; b < B; ++b) batch[b]->length = std::max<int64_t>(0, std::min(g.M[b] - 1, g.K[b]));
  if (static_cast<int64_t>(rows.size()) == T) return x;
  return x.index_select(0, Upload(rows, device_));
}

at::Tensor IncrementalModel::RunPadded(const DecodeBucket& bucket, const PassGeometry& g, const PoolPlan& plan) {
  const bool decode = bucket.tokens == 1;
  // Captures hold the pool's and the table's addresses.
  if (pool_.get() != graphs_pool_ || pool_->generation() != graphs_pool_generation_ || rel_size_ != graphs_rel_size_) {
    graphs_.clear();
    graphs_pool_ = pool_.get();
    graphs_pool_generation_ = pool_->generation();
    graphs_rel_size_ = rel_size_;
  }
  const int64_t count = MetaCount(g, plan);
  DecodeGraph& graph = graphs_[bucket];
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  if (!graph.meta.defined()) {
    graph.meta = at::empty({count}, lopt.device(device_));
    graph.distances = g.D;
  }
  // A bucket's pass has one shape: its metadata's length and its distances
  // are what the capture holds.
  TORCH_CHECK(graph.meta.numel() == count && graph.distances == g.D, "a padded pass of bucket (", bucket.sessions, ", ",
              bucket.tokens, ", ", bucket.keys, ") changed shape: ", count, " metadata values and ", g.D,
              " distances, against ", graph.meta.numel(), " and ", graph.distances);
  if (device_.is_cpu()) {
    PackMeta(g, plan, graph.meta.data_ptr<int64_t>());
  } else {  // packed into pinned memory, copied on the stream the pass runs on
    at::Tensor host = at::empty({count}, lopt.pinned_memory(true));
    PackMeta(g, plan, host.data_ptr<int64_t>());
    graph.meta.copy_(host, /*non_blocking=*/true);
  }
  const std::vector<Pending*> none;  // a padded pass reads no session's host state
  auto body = [&]() {
    std::vector<std::vector<at::Tensor>> new_k(g.B), new_v(g.B);  // stay empty: every write is in place
    return Layers(none, g, plan, DeriveMeta(g, plan, graph.meta), new_k, new_v);
  };
  ++(decode ? graph_counts_.padded : graph_counts_.pass_padded);
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
      ++(decode ? graph_counts_.captured : graph_counts_.pass_captured);
    } catch (const c10::Error& e) {
      // x is the warm-up's result where the warm-up ran (Capture gives it
      // before it captures). A multi-token pass whose warm-up failed cannot
      // run again (its writes land on keys it reads): the step fails, Step's
      // backup puts the keys back, and later passes of the bucket run
      // unpadded; other buckets keep their graphs, since no capture failed.
      if (!decode && !x.defined()) {
        graph.warm_up_failed = true;  // not again: the pass runs unpadded (it may need less memory)
        throw;
      }
      // These graphs off for good (KernelPath says why). A failed decode
      // capture turns every graph off; a multi-token pass's, only those.
      graph_error_ = e.what_without_backtrace();
      pass_graphs_ = false;
      if (decode) decode_graphs_ = false;
      // A decode pass whose warm-up failed runs again eagerly (its writes to
      // the pool repeat any the warm-up made, with the same values), before
      // the buckets are dropped: body reads this bucket's metadata.
      if (!x.defined()) x = body();
      if (decode) {
        graphs_.clear();
      } else {
        for (auto it = graphs_.begin(); it != graphs_.end();) it = it->first.tokens > 1 ? graphs_.erase(it) : ++it;
      }
    }
  } else {
    x = graph.captured->Replay().clone();
    ++(decode ? graph_counts_.replayed : graph_counts_.pass_replayed);
  }
  return x;
}

}  // namespace txl
