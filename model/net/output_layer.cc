#include "model/net/output_layer.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "model/net/download.h"
#include "model/net/txl_math.h"
#include "model/net/upload.h"

namespace txl {

namespace {

// Adds to lists[rows[j]] the top min(n, cols) words of lp's row j (ids
// offset by `first`), or more where words tie with the last of them: every
// word not added is strictly below all that were.
void AddTopOfBin(const at::Tensor& lp, const std::vector<int64_t>& rows, int64_t first, int n,
                 std::vector<TokenList>* lists) {
  const int64_t k = std::min<int64_t>(n, lp.size(1));
  auto [values, ids] = lp.topk(k, 1, /*largest=*/true, /*sorted=*/true);
  at::Tensor cut = values.select(1, k - 1).unsqueeze(1);
  at::Tensor at_or_above = (lp >= cut).sum(1);
  const std::vector<at::Tensor> host = Download({values.to(at::kFloat), ids, at_or_above});
  const at::Tensor &v = host[0], &i = host[1], &count = host[2];
  for (size_t j = 0; j < rows.size(); ++j) {
    TokenList& list = (*lists)[rows[j]];
    if (count.data_ptr<int64_t>()[j] == k) {
      for (int64_t m = 0; m < k; ++m)
        list.emplace_back(static_cast<int>(first + i.data_ptr<int64_t>()[j * k + m]), v.data_ptr<float>()[j * k + m]);
      continue;
    }
    // A tie across the cut: the selection's choice among equals is not
    // the lower id, so every word at or above the cut goes to the host.
    at::Tensor row = lp.select(0, static_cast<int64_t>(j));
    at::Tensor tied = (row >= cut.select(0, static_cast<int64_t>(j))).nonzero().squeeze(1);
    at::Tensor tv = row.index_select(0, tied).to(at::kCPU, at::kFloat).contiguous();
    at::Tensor ti = tied.to(at::kCPU).contiguous();
    for (int64_t m = 0; m < ti.numel(); ++m)
      list.emplace_back(static_cast<int>(first + ti.data_ptr<int64_t>()[m]), tv.data_ptr<float>()[m]);
  }
}

void KeepBest(TokenList* list, int n) {
  std::sort(list->begin(), list->end(), Likelier);
  if (list->size() > static_cast<size_t>(n)) list->resize(n);
}

}  // namespace

OutputLayer::OutputLayer(const ModelConfig& c, const TxlWeights& w) : c_(c), w_(w), ends_(c.cutoff_ends()) {
  std::tie(head_w_, head_b_) = HeadWeights(c, w);
}

at::Tensor OutputLayer::HeadLogProbs(const at::Tensor& hidden) const {
  return at::log_softmax(ProjectedLinear(hidden, head_w_, head_b_, w_.out_projs[0]), -1);
}

// Cluster i's words, as full log-probs: their own log-softmax plus the head's
// entry for the cluster (the same sum LogProbs forms).
at::Tensor OutputLayer::ClusterLogProbs(const at::Tensor& hidden, const at::Tensor& head, int64_t i) const {
  const int64_t col = ClusterColumn(c_, i);
  return at::log_softmax(BinLogits(c_, w_, hidden, i), -1) + head.slice(-1, col, col + 1);
}

at::Tensor OutputLayer::LogProbs(const at::Tensor& hidden) const {
  at::Tensor head = HeadLogProbs(hidden);
  const int64_t nc = c_.n_clusters();
  if (nc == 0) return head;
  std::vector<at::Tensor> pieces = {head.slice(-1, 0, ends_[1])};
  for (int64_t i = 1; i <= nc; ++i) pieces.push_back(ClusterLogProbs(hidden, head, i));
  return at::cat(pieces, -1);
}

at::Tensor OutputLayer::AllowedLogProbs(const at::Tensor& hidden, const std::vector<const AllowedTokens*>& allowed,
                                        const at::Tensor& given_head) const {
  const at::Tensor head = given_head.defined() ? given_head : HeadLogProbs(hidden);
  const int64_t nc = c_.n_clusters();
  if (nc == 0) return head;
  // Whether some row allows a token of cluster i: a word of 64 ids at a time.
  auto holds = [&](int64_t i) {
    for (const AllowedTokens* a : allowed) {
      for (int64_t w = ends_[i] / 64; w * 64 < ends_[i + 1] && w < static_cast<int64_t>(a->words.size()); ++w) {
        uint64_t word = a->words[static_cast<size_t>(w)];
        if (w * 64 < ends_[i]) word &= ~uint64_t{0} << (ends_[i] - w * 64);
        if ((w + 1) * 64 > ends_[i + 1]) word &= ~uint64_t{0} >> ((w + 1) * 64 - ends_[i + 1]);
        if (word != 0) return true;
      }
    }
    return false;
  };
  int64_t last = 0;  // the last cluster that holds one
  for (int64_t i = 1; i <= nc; ++i) {
    if (holds(i)) last = i;
  }
  std::vector<at::Tensor> pieces = {head.slice(-1, 0, ends_[1])};
  for (int64_t i = 1; i <= last; ++i) {
    pieces.push_back(holds(i) ? ClusterLogProbs(hidden, head, i)
                              : at::full({hidden.size(0), ends_[i + 1] - ends_[i]}, -INFINITY, head.options()));
  }
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, -1);
}

std::vector<float> OutputLayer::TargetLogProbs(const at::Tensor& hidden, const std::vector<int>& targets) const {
  const int64_t rows = hidden.size(0);
  if (rows == 0) return {};
  const at::Device device = hidden.device();
  at::Tensor head = HeadLogProbs(hidden);
  // Rows by the bin their target is in; bin 0 is the shortlist (the head).
  const int64_t bins = c_.n_clusters() + 1;
  std::vector<std::vector<int64_t>> row_of(bins), col_of(bins);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r];
    const int64_t bin = std::upper_bound(ends_.begin() + 1, ends_.end(), t) - ends_.begin() - 1;
    row_of[bin].push_back(r);
    col_of[bin].push_back(t - ends_[bin]);
  }
  at::Tensor out = at::empty({rows}, head.options());
  for (int64_t bin = 0; bin < bins; ++bin) {
    if (row_of[bin].empty()) continue;
    at::Tensor idx = Upload(row_of[bin], device);
    at::Tensor lp = bin == 0 ? head.index_select(0, idx)
                             : ClusterLogProbs(hidden.index_select(0, idx), head.index_select(0, idx), bin);
    out.index_copy_(0, idx, lp.gather(1, Upload(col_of[bin], device).unsqueeze(1)).squeeze(1));
  }
  at::Tensor host = out.to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + rows);
}

TokenPicks OutputLayer::BestTokens(const at::Tensor& hidden, const at::Tensor& given_head) const {
  const int64_t rows = hidden.size(0);
  if (rows == 0) return {};
  const at::Tensor head = given_head.defined() ? given_head : HeadLogProbs(hidden);
  // argmax, not max(dim): its ties are documented to go to the first index.
  auto best_of = [](const at::Tensor& lp) {
    at::Tensor i = lp.argmax(1);
    return std::make_pair(lp.gather(1, i.unsqueeze(1)).squeeze(1), i);
  };
  auto [value, id] = best_of(head.slice(1, 0, ends_[1]));
  for (int64_t i = 1; i <= c_.n_clusters(); ++i) {
    // No word of a cluster is more likely than the cluster itself (its head
    // entry is their total), so only rows whose cluster entry beats their best
    // so far can find a better word there; the others skip its logits. Exact.
    const int64_t col = ClusterColumn(c_, i);
    at::Tensor rows = (head.select(1, col) > value).nonzero().squeeze(1);
    if (rows.numel() == 0) continue;
    auto [v, k] = best_of(ClusterLogProbs(hidden.index_select(0, rows), head.index_select(0, rows), i));
    at::Tensor better = v > value.index_select(0, rows);  // strictly: on a tie the lower id stays
    value.index_copy_(0, rows, at::where(better, v, value.index_select(0, rows)));
    id.index_copy_(0, rows, at::where(better, k + ends_[i], id.index_select(0, rows)));
  }
  const std::vector<at::Tensor> host = Download({id, value.to(at::kFloat)});
  const at::Tensor &ids = host[0], &lps = host[1];
  TokenPicks out;
  out.ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + rows);
  out.logprobs.assign(lps.data_ptr<float>(), lps.data_ptr<float>() + rows);
  return out;
}

TokenPicks OutputLayer::DrawTokens(const at::Tensor& hidden, const std::vector<double>& uniforms,
                                   const at::Tensor& given_head) const {
  const int64_t rows = hidden.size(0);
  if (rows == 0) return {};
  const at::Device device = hidden.device();
  const int64_t shortlist = ends_[1], nc = c_.n_clusters();
  const at::Tensor head = given_head.defined() ? given_head : HeadLogProbs(hidden);
  // The head's entries in the walk's order: shortlist words, then clusters
  // 1..nc (whose words follow the shortlist in id order).
  at::Tensor walk = head;
  if (nc > 0) {
    std::vector<int64_t> cols;
    for (int64_t i = 1; i <= nc; ++i) cols.push_back(ClusterColumn(c_, i));
    walk = at::cat({head.slice(1, 0, shortlist), head.index_select(1, Upload(cols, device))}, 1);
  }
  // Cumulative mass in double, as the sampler's walk over a full row sums.
  at::Tensor cdf = walk.to(at::kDouble).exp().cumsum(1);
  at::Tensor goal = Upload(uniforms, device) * cdf.select(1, -1);
  at::Tensor entry = at::searchsorted(cdf, goal.unsqueeze(1), /*out_int32=*/false, /*right=*/true)
                         .squeeze(1)
                         .clamp_max(walk.size(1) - 1);
  at::Tensor before =
      at::where(entry > 0, cdf.gather(1, (entry - 1).clamp_min(0).unsqueeze(1)).squeeze(1), at::zeros_like(goal));
  at::Tensor entry_lp = walk.gather(1, entry.unsqueeze(1)).squeeze(1);

  const std::vector<at::Tensor> host = Download({entry, entry_lp.to(at::kFloat)});
  const at::Tensor &entry_host = host[0], &lp_host = host[1];
  const int64_t* e = entry_host.data_ptr<int64_t>();
  TokenPicks out;
  out.ids.resize(rows);
  out.logprobs.resize(rows);
  std::vector<std::vector<int64_t>> rows_in(nc + 1);
  for (int64_t r = 0; r < rows; ++r) {
    if (e[r] < shortlist) {
      out.ids[r] = static_cast<int>(e[r]);
      out.logprobs[r] = lp_host.data_ptr<float>()[r];
    } else {
      rows_in[e[r] - shortlist + 1].push_back(r);
    }
  }
  // Inside a cluster the walk goes on from the mass before it.
  for (int64_t i = 1; i <= nc; ++i) {
    if (rows_in[i].empty()) continue;
    at::Tensor idx = Upload(rows_in[i], device);
    at::Tensor lp = ClusterLogProbs(hidden.index_select(0, idx), head.index_select(0, idx), i);
    at::Tensor ccdf = lp.to(at::kDouble).exp().cumsum(1) + before.index_select(0, idx).unsqueeze(1);
    at::Tensor k = at::searchsorted(ccdf, goal.index_select(0, idx).unsqueeze(1), false, true)
                       .squeeze(1)
                       .clamp_max(lp.size(1) - 1);
    const std::vector<at::Tensor> picked = Download({k, lp.gather(1, k.unsqueeze(1)).squeeze(1).to(at::kFloat)});
    const at::Tensor &k_host = picked[0], &klp = picked[1];
    for (size_t n = 0; n < rows_in[i].size(); ++n) {
      out.ids[rows_in[i][n]] = static_cast<int>(ends_[i] + k_host.data_ptr<int64_t>()[n]);
      out.logprobs[rows_in[i][n]] = klp.data_ptr<float>()[n];
    }
  }
  return out;
}

std::vector<TokenList> OutputLayer::TopTokens(const at::Tensor& hidden, int n) const {
  const int64_t rows = hidden.size(0);
  std::vector<TokenList> lists(rows);
  if (rows == 0 || n <= 0) return lists;
  const at::Device device = hidden.device();
  const int64_t nc = c_.n_clusters();
  at::Tensor head = HeadLogProbs(hidden);
  std::vector<int64_t> all(rows);
  for (int64_t r = 0; r < rows; ++r) all[r] = r;
  AddTopOfBin(head.slice(1, 0, ends_[1]), all, 0, n, &lists);
  for (TokenList& list : lists) KeepBest(&list, n);
  if (nc == 0) return lists;
  std::vector<int64_t> cols;
  for (int64_t i = 1; i <= nc; ++i) cols.push_back(ClusterColumn(c_, i));
  at::Tensor entries = head.index_select(1, Upload(cols, device)).to(at::kCPU, at::kFloat).contiguous();
  for (int64_t i = 1; i <= nc; ++i) {
    // No word of a cluster beats the cluster's head entry, and on a tie the
    // lower id (already listed) wins; so a row with n words above the entry
    // skips the cluster's logits. Exact.
    std::vector<int64_t> need;
    for (int64_t r = 0; r < rows; ++r) {
      const float entry = entries.data_ptr<float>()[r * nc + (i - 1)];
      if (lists[r].size() < static_cast<size_t>(n) || entry > lists[r].back().second) need.push_back(r);
    }
    if (need.empty()) continue;
    at::Tensor idx = Upload(need, device);
    AddTopOfBin(ClusterLogProbs(hidden.index_select(0, idx), head.index_select(0, idx), i), need, ends_[i], n, &lists);
    for (int64_t r : need) KeepBest(&lists[r], n);
  }
  return lists;
}

}  // namespace txl
