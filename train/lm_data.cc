#include "train/lm_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace txl {

absl::StatusOr<CorpusSplit> SplitCorpus(const std::vector<int>& ids, double valid_fraction) {
  if (ids.empty()) return absl::InvalidArgumentError("the corpus is empty");
  if (!(valid_fraction > 0.0 && valid_fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("valid fraction must be in (0, 1), got ", valid_fraction));
  }
  const auto n_valid = static_cast<int64_t>(static_cast<double>(ids.size()) * valid_fraction);
  if (n_valid < 2 || static_cast<int64_t>(ids.size()) - n_valid < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a corpus of ", ids.size(), " tokens is too short to split with fraction ", valid_fraction));
  }
  CorpusSplit split;
  split.train.assign(ids.begin(), ids.end() - n_valid);
  split.valid.assign(ids.end() - n_valid, ids.end());
  return split;
}

absl::StatusOr<OrderedBatches> OrderedBatches::Create(const std::vector<int>& data, int64_t total_streams,
                                                      int64_t first, int64_t count, int64_t tgt_len) {
  if (total_streams < 1 || tgt_len < 1 || count < 1 || first < 0 || first + count > total_streams) {
    return absl::InvalidArgumentError(absl::StrCat("bad stream layout: total ", total_streams, ", first ", first,
                                                   ", count ", count, ", tgt_len ", tgt_len));
  }
  const int64_t stream_len = static_cast<int64_t>(data.size()) / total_streams;
  // A segment needs tgt_len inputs plus the token that follows the last one.
  if (stream_len < tgt_len + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data (", data.size(), " tokens) is shorter than one segment: ", total_streams,
                     " streams x (tgt_len ", tgt_len, " + 1) = ", total_streams * (tgt_len + 1), " tokens"));
  }
  OrderedBatches b;
  b.data_ = data;
  b.stream_len_ = stream_len;
  b.total_ = total_streams;
  b.first_ = first;
  b.count_ = count;
  b.tgt_len_ = tgt_len;
  b.segments_ = (stream_len - 1 + tgt_len - 1) / tgt_len;
  return b;
}

Segment OrderedBatches::Get(int64_t index) const {
  Segment s;
  const int64_t start = index * tgt_len_;
  s.len = std::min(tgt_len_, stream_len_ - 1 - start);
  s.input.resize(s.len * count_);
  s.target.resize(s.len * count_);
  for (int64_t t = 0; t < s.len; ++t) {
    for (int64_t b = 0; b < count_; ++b) {
      const int64_t base = (first_ + b) * stream_len_ + start + t;
      s.input[t * count_ + b] = data_[base];
      s.target[t * count_ + b] = data_[base + 1];
    }
  }
  return s;
}

}  // namespace txl
