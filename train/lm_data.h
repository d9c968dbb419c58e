// Language-model data as the original code feeds it (LMOrderedIterator): the
// token stream cut into parallel streams, read in consecutive segments of
// tgt_len so that each segment continues where the last one ended (which is
// what lets the memories carry over). Torch-free.
#ifndef TXL_TRAIN_LM_DATA_H_
#define TXL_TRAIN_LM_DATA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace txl {

struct CorpusSplit {
  std::vector<int> train, valid;
};

// The last `valid_fraction` of the stream becomes the validation split.
absl::StatusOr<CorpusSplit> SplitCorpus(const std::vector<int>& ids, double valid_fraction);

struct Segment {
  int64_t len = 0;              // rows (<= tgt_len; the last one may be short)
  std::vector<int64_t> input;   // [len, streams] row-major
  std::vector<int64_t> target;  // the next token of each input, same shape
};

class OrderedBatches {
 public:
  // Cuts `data` into `total_streams` equal columns (the tail that does not
  // fill a row is dropped) and serves columns [first, first + count).
  // Data-parallel ranks take disjoint column ranges of one global cut, so
  // W ranks with B columns each see exactly what 1 rank with W*B sees.
  static absl::StatusOr<OrderedBatches> Create(const std::vector<int>& data, int64_t total_streams, int64_t first,
                                               int64_t count, int64_t tgt_len);

  int64_t segments() const { return segments_; }  // per pass over the data
  int64_t streams() const { return count_; }
  Segment Get(int64_t index) const;  // index in [0, segments())

 private:
  OrderedBatches() = default;
  std::vector<int> data_;
  int64_t stream_len_ = 0, total_ = 0, first_ = 0, count_ = 0, tgt_len_ = 0, segments_ = 0;
};

}  // namespace txl

#endif  // TXL_TRAIN_LM_DATA_H_
