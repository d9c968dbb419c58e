// CPU kernels of a prefill pass (IncrementalModel::Pass): the attention
// softmax over a pass's score blocks, fused. Torch-free, like
// decode_kernels.h, whose KernelIsa and Elem it shares.
#ifndef TXL_MODEL_KERNELS_PREFILL_KERNELS_H_
#define TXL_MODEL_KERNELS_PREFILL_KERNELS_H_

#include <cstdint>

#include "model/kernels/decode_kernels.h"

namespace txl {

// Rows are (session b, head h, query i), i < N, in that order. Query i of
// session b sees the keys j with max(0, m_b + i - M_b + 1) <= j <= m_b + i
// (its window, the same_length rule): score (ac[j] + bd[m_b + i - j]) *
// scale, softmax over those keys, zero elsewhere; rows with i >= n_b
// (padding) are all zero. One pass over each row, instead of the gather,
// add, scale, mask and softmax of separate tensor operations.
struct ScoreSoftmaxArgs {
  const void* ac;          // [rows, K] content scores (q + u) . k_j, of `elem`
  const void* bd;          // [rows, D] position scores (q + v) . r_d at distance d, of `elem`
  Elem elem = Elem::kF32;  // kF32 or kBf16
  int64_t heads, N, K, D;
  const int64_t* held;    // m_b: keys before the session's first query
  const int64_t* fed;     // n_b: the session's queries in this pass
  const int64_t* window;  // M_b: its mem_len
  float scale;
  void* prob;  // [rows, K] of `prob_elem` (kF32 or kBf16)
  Elem prob_elem = Elem::kF32;
};
void ScoreSoftmax(const ScoreSoftmaxArgs& args, int64_t begin, int64_t end, KernelIsa isa = KernelIsa::kBest);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_PREFILL_KERNELS_H_
