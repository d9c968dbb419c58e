// The parts of an IncrementalModel pass that its files share
// (incremental_pass.cc builds them; incremental_graphs.cc pads them to a
// decode bucket). Internal to model/net.
#ifndef TXL_MODEL_NET_INCREMENTAL_PASS_H_
#define TXL_MODEL_NET_INCREMENTAL_PASS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "model/net/incremental.h"
#include "model/net/upload.h"

namespace txl {

// Session b feeds n[b] tokens after its m[b] held positions, in a window of
// M[b] keys: K[b] = m[b] + n[b] keys. Padded, the pass is a score block of
// [B sessions, N queries, Kmax keys].
struct IncrementalModel::PassGeometry {
  int64_t B = 0, T = 0;     // sessions; tokens of all of them
  int64_t N = 0, Kmax = 0;  // the most tokens, and keys, of a session
  int64_t D = 0;            // distances that can be attended
  std::vector<int64_t> n, m, M, K;
  std::vector<int64_t> flat;  // the tokens, session by session
  bool uniform = true;        // every session feeds N tokens
  std::vector<int64_t> rows;  // token t's row of the padded [B * N] (empty when uniform)
  // Written in place: a pooled memory always (Step's RingBackup keeps the
  // committed rows it overwrites); a ring where the new keys/values fit in
  // free slots (the span from the oldest committed position to the newest
  // new one is at most mem_len). Otherwise (rings only) the pass builds the
  // new held memory aside and the commit installs it.
  std::vector<char> in_place;
};

// The generic path, where every memory is in the pool: per layer, every
// session's keys come out as [B, Kmax] with one indexed gather (padding
// reads the pool's zero row), and the new keys that the windows keep go
// into their pool rows with one indexed copy. One token a session: written
// first and gathered with the rest. Several: laid over the gathered block
// with a third copy, and written after the gather (a slot may hold a key
// that the pass still reads). So a pass dispatches the same ops for any
// number of sessions. Without the pool (gather false: the CPU kernels) each
// session's keys are copied one by one.
struct IncrementalModel::PoolPlan {
  bool gather = false;
  bool write_after_gather = false;
  std::vector<int64_t> gather_rows;            // [B * Kmax]: each padded key's pool row
  std::vector<int64_t> write_rows, write_tok;  // the pool row of each new key that goes in, and its token
  std::vector<int64_t> patch_rows, patch_tok;  // the padded row of each new key laid over, and its token
};

// The step's metadata (tokens, padded row indices, and for the tensor-op
// softmax the sessions' lengths) on the device.
struct IncrementalModel::PassMeta {
  at::Tensor tokens;   // [T]
  at::Tensor row_idx;  // PassGeometry::rows
  // Generic path: the score block's mask [B, 1, N, Kmax] and each score's
  // distance, [B, H, N, Kmax].
  at::Tensor masked, gather_idx;
  // Generic path: each session's held keys m and window M, [B] each.
  at::Tensor held, window;
  // PoolPlan's lists.
  at::Tensor gather_rows, write_rows, write_tok, patch_rows, patch_tok;
  // Where the split decode attention runs on a GPU: its counters,
  // [layers, B * H] int32 zeros (SplitDecodeArgs::done), set in one fill.
  at::Tensor split_done;
};

}  // namespace txl

#endif  // TXL_MODEL_NET_INCREMENTAL_PASS_H_
