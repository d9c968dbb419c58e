#include "server/core/choices.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace txl {

ChoiceSet::ChoiceSet(int n, int best_of, GenerateCallbacks transport, std::function<void()> on_error)
    : n_(n), best_of_(best_of), transport_(std::move(transport)), on_error_(std::move(on_error)) {
  candidates_.resize(static_cast<size_t>(best_of));
}

void ChoiceSet::Branched(int64_t input_tokens, const JobTimes& times) {
  absl::MutexLock lock(&mu_);
  input_tokens_ = input_tokens;
  times_ = times;
}

GenerateCallbacks ChoiceSet::For(int index) {
  std::shared_ptr<ChoiceSet> self = shared_from_this();
  GenerateCallbacks cb;
  cb.on_tokens = [self, index](std::vector<GeneratedTokenEvent> events, int64_t position) {
    self->Tokens(index, std::move(events), position);
  };
  cb.on_done = [self, index](absl::Status status, GenerateResult result) {
    self->Ended(index, std::move(status), std::move(result));
  };
  return cb;
}

void ChoiceSet::Tokens(int index, std::vector<GeneratedTokenEvent> events, int64_t position) {
  {
    absl::MutexLock lock(&mu_);
    Candidate& c = candidates_[static_cast<size_t>(index)];
    // A NaN (a broken row) ranks last rather than breaking the sort's order.
    for (const GeneratedTokenEvent& e : events) c.logprob += std::isnan(e.logprob) ? -INFINITY : e.logprob;
    if (!first_token_seconds_) first_token_seconds_ = absl::ToDoubleSeconds(absl::Now() - start_);
    if (best_of_ > n_) {  // which ones go out is known only at the end
      c.held.emplace_back(std::move(events), position);
      return;
    }
  }
  for (GeneratedTokenEvent& e : events) e.choice = index;
  if (transport_.on_tokens) transport_.on_tokens(std::move(events), position);
}

void ChoiceSet::Ended(int index, absl::Status status, GenerateResult result) {
  Actions actions;
  bool failed = false;
  {
    absl::MutexLock lock(&mu_);
    Candidate& c = candidates_[static_cast<size_t>(index)];
    if (c.ended) return;
    c.ended = true;
    c.end = ChoiceEnd{index, result.finish, result.generated_tokens, result.position, std::move(result.trailing_text)};
    if (!status.ok() && status_.ok()) {
      status_ = std::move(status);
      failed = true;
    }
    if (++ended_ == best_of_) {
      Finish(actions);
    } else if (best_of_ == n_ && status_.ok() && transport_.on_choice_end) {  // its end goes out now
      c.end.sent = true;
      actions.push_back([on_end = transport_.on_choice_end, end = c.end] { on_end(end); });
    }
  }
  if (failed && on_error_) on_error_();
  for (auto& a : actions) a();
}

void ChoiceSet::Fail(absl::Status status) {
  Actions actions;
  bool failed = false;
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) {
      status_ = std::move(status);
      failed = true;
    }
    for (int i = 0; i < best_of_; ++i) {
      Candidate& c = candidates_[static_cast<size_t>(i)];
      if (c.ended) continue;
      c.ended = true;
      if (++ended_ == best_of_) Finish(actions);
    }
  }
  if (failed && on_error_) on_error_();
  for (auto& a : actions) a();
}

void ChoiceSet::Finish(Actions& out) {
  if (!status_.ok()) {
    out.push_back([done = transport_.on_done, status = status_] {
      if (done) done(status, GenerateResult());
    });
    return;
  }
  // The kept: all (n == best_of), or the n highest totals, ties to the lower index.
  std::vector<int> order(candidates_.size());
  std::iota(order.begin(), order.end(), 0);
  if (best_of_ > n_) {
    std::stable_sort(order.begin(), order.end(), [this](int a, int b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return candidates_[static_cast<size_t>(a)].logprob > candidates_[static_cast<size_t>(b)].logprob;
    });
    order.resize(static_cast<size_t>(n_));
  }
  GenerateResult r;
  r.input_tokens = input_tokens_;
  for (const Candidate& c : candidates_) r.generated_tokens += c.end.generated_tokens;
  r.times.queue_seconds = times_.queue_seconds;
  r.times.total_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  // Held for best_of, the first token reaches the transport only now.
  r.times.first_token_seconds = best_of_ > n_ ? r.times.total_seconds : first_token_seconds_.value_or(0);
  for (int j = 0; j < static_cast<int>(order.size()); ++j) {
    Candidate& c = candidates_[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (auto& [events, position] : c.held) {
      for (GeneratedTokenEvent& e : events) e.choice = j;
      out.push_back([on_tokens = transport_.on_tokens, events = std::move(events), position = position]() mutable {
        if (on_tokens) on_tokens(std::move(events), position);
      });
    }
    c.held.clear();
    ChoiceEnd end = std::move(c.end);
    end.index = j;
    r.choices.push_back(std::move(end));
  }
  r.finish = r.choices.front().finish;
  out.push_back([done = transport_.on_done, r = std::move(r)]() mutable {
    if (done) done(absl::OkStatus(), std::move(r));
  });
}

}  // namespace txl
