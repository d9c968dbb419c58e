#include "server/jobs/generate_job.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "server/jobs/job_runner.h"

namespace txl {

GenerateJob::GenerateJob(SessionLease lease, GenerateSpec spec, GenerateCallbacks callbacks)
    : FeedJob(std::move(lease), spec.input),
      spec_(std::move(spec)),
      started_(spec_.call_start == absl::InfinitePast() ? submitted : spec_.call_start),
      callbacks_(std::move(callbacks)),
      sampler_(spec_.sampling, std::random_device{}()),
      text_(spec_.stop_sequences) {
  if (spec_.grammar) {
    grammar_.emplace(spec_.grammar);
    sampler_.Constrain();  // each pick takes only what can continue the text
  }
}

void GenerateJob::Run(JobRunner& runner) {
  // Request validation refuses a generation with nothing to continue from;
  // without this check such a job would wait for a row forever.
  if (feed.empty() && !decoding_) {
    runner.Finish(*this, absl::InternalError("generate: nothing to feed"));
    return;
  }
  // Echo computes every input token: no cached or bounded start.
  if (!decoding_ && fed == 0 && !spec_.echo) {
    if (absl::Status s = StartStateless(runner); !s.ok()) runner.Finish(*this, s);
  }
  if (!decoding_ && spec_.max_new_tokens == 0 && prefill_left() == 0) {  // one token: nothing to predict
    if (echo_.empty() && pending_len == 0) echo_.push_back({feed[0], false, 0.0f});
    finish_ = Finish::kLength;
    runner.Finish(*this, absl::OkStatus());
  }
}

size_t GenerateJob::prefill_left() const {
  // Generating nothing, the last input token is not fed (nothing follows
  // it): it stays pending, as after a committed score.
  const size_t total = spec_.max_new_tokens == 0 && !feed.empty() ? feed.size() - 1 : feed.size();
  return total > fed ? total - fed : 0;
}

StepInput GenerateJob::Row(size_t n) {
  StepInput in;
  if (decoding_) {
    in.tokens = {last_};
  } else {
    in = Slice(n);
    // Echo: each fed token scores the next input token (none after the last).
    if (spec_.echo) in.targets.assign(feed.begin() + fed + 1, feed.begin() + std::min(feed.size(), fed + n + 1));
  }
  in.session = state();
  if (!decoding_ && (n != prefill_left() || spec_.max_new_tokens == 0)) return in;  // no next token wanted
  // The text so far ends in a word (word level): the next word is spaced.
  if (!decoding_) after_word_ = lease.model->tokenizer().EndsAfterWord(feed.back());
  // The first token's mask; a later token's was taken with the token before it (TakeOutput).
  if (grammar_ && !decoding_) {
    absl::StatusOr<std::shared_ptr<const TokenMask>> mask = NextMask();
    if (!mask.ok()) {  // no token can begin the text here: the row asks for nothing, and TakeOutput ends the call
      dead_end_ = mask.status();
      return in;
    }
    mask_ = *std::move(mask);
  }
  // The model picks the token (constrained, with a grammar), or lists the
  // tokens the draw and the alternatives need (docs/DESIGN.md, "Sampling
  // paths"): no whole row leaves it, unless a bias, a penalty, or a
  // grammar under top-k or top-p needs it.
  in.plan = sampler_.Plan(spec_.top_logprobs,
                          mask_ == nullptr ? nullptr : std::shared_ptr<const AllowedTokens>(mask_, &mask_->bits));
  in.want_last_distribution = sampler_.Adjusts();  // drawn here from the whole row
  return in;
}

absl::StatusOr<std::shared_ptr<const TokenMask>> GenerateJob::NextMask() {
  const Tokenizer& tokenizer = lease.model->tokenizer();
  if (masker_ == nullptr) {  // the spec's when it was made for this model's vocabulary
    masker_ = spec_.masker != nullptr && &spec_.masker->tokenizer() == &tokenizer
                  ? spec_.masker
                  : TokenMasker::Create(spec_.grammar, tokenizer);
  }
  std::shared_ptr<const TokenMask> mask = masker_->Next(*grammar_, after_word_);
  if (mask->vocab != lease.model->config().n_token) {
    return absl::InternalError(
        absl::StrCat("grammar: a mask of ", mask->vocab, " tokens for a model of ", lease.model->config().n_token));
  }
  if (mask->count == 0) {
    return absl::FailedPreconditionError("grammar: no token of the model's vocabulary can continue the output here");
  }
  return mask;
}

void GenerateJob::TakeOutput(JobRunner& runner, StepOutput& out, size_t n) {
  if (!decoding_) {
    if (spec_.echo) AppendScores(out, n, &echo_);
    fed += n;
    if (spec_.max_new_tokens == 0) {
      if (prefill_left() == 0) {
        finish_ = Finish::kLength;
        runner.Finish(*this, absl::OkStatus());
      }
      return;
    }
  }
  // A pick, a list, a nucleus or a whole row (Row asks for one) arrives
  // after the prefill and after each decode.
  const bool picked = out.picked >= 0, listed = !out.top.empty(), nucleus = !out.nucleus.empty();
  const bool whole = sampler_.Adjusts() && !out.last_distribution.empty();
  const bool wanted = decoding_ || prefill_left() == 0;  // this row asked for the next token
  if (!dead_end_.ok() && wanted) {                       // Row met a dead end
    runner.Finish(*this, dead_end_);
    return;
  }
  if (mask_ != nullptr && !sampler_.Adjusts() && !picked && wanted) {  // the model's constrained pick found none
    runner.Finish(*this, absl::InternalError("generate: no token the grammar allows has a finite log-prob (the "
                                             "model's distribution holds NaN or +inf)"));
    return;
  }
  if (!picked && !listed && !nucleus && !whole) {
    if (wanted) {  // a row that asked for the next token got none
      runner.Finish(*this, absl::InternalError("generate: the step gave no next token"));
    }
    return;  // mid-prefill
  }
  const bool first = !decoding_;
  GeneratedTokenEvent ev;
  auto logprob_in = [&](const TokenList& list) {
    return std::find_if(list.begin(), list.end(), [&](const auto& t) { return t.first == ev.id; })->second;
  };
  if (whole) {  // the bias and penalties applied; log-probs are the adjusted distribution's
    const std::vector<float> adjusted = sampler_.Adjusted(out.last_distribution);
    if (adjusted.empty()) {
      runner.Finish(*this, absl::InternalError("generate: the model's distribution holds NaN or +inf"));
      return;
    }
    // A grammar draws only what can continue the text; the log-probs stay the adjusted row's.
    const std::vector<float> drawn_from = mask_ != nullptr ? Masked(adjusted, mask_->bits) : std::vector<float>();
    if (mask_ != nullptr && std::none_of(drawn_from.begin(), drawn_from.end(), [](float x) { return x > -INFINITY; })) {
      runner.Finish(*this,
                    absl::FailedPreconditionError("grammar: logit_bias bans every token the grammar allows here"));
      return;
    }
    ev.id = sampler_.Sample(mask_ != nullptr ? drawn_from : adjusted);
    if (ev.id < 0) {
      runner.Finish(*this, absl::InternalError("generate: the model's distribution holds NaN or +inf"));
      return;
    }
    ev.logprob = adjusted[ev.id];
    sampler_.Count(ev.id);
    if (spec_.top_logprobs > 0) {  // the adjusted row's; banned tokens (-inf) are no alternatives
      out.top = TopN(adjusted, spec_.top_logprobs);
      while (!out.top.empty() && out.top.back().second == -INFINITY) out.top.pop_back();
    }
  } else if (picked) {
    ev.id = out.picked;
    ev.logprob = out.picked_logprob;  // the model's own, before a grammar's constraint
  } else if (nucleus) {
    ev.id = sampler_.SampleFromNucleus(out.nucleus, out.nucleus_total);
    ev.logprob = logprob_in(out.nucleus);
  } else {
    ev.id = sampler_.TopCandidates() > 0 ? sampler_.SampleFromTop(out.top) : out.top.front().first;
    ev.logprob = logprob_in(out.top);
  }
  const int token = ev.id;
  if (first) ev.echo = std::move(echo_);
  if (spec_.top_logprobs > 0)
    ev.top = TokenList(out.top.begin(), out.top.begin() + std::min<size_t>(out.top.size(), spec_.top_logprobs));
  if (mask_ != nullptr && !mask_->bits.contains(token)) {  // the model's constrained pick: never
    runner.Finish(*this, absl::InternalError("generate: the model picked a token the grammar does not allow"));
    return;
  }
  // The text as the tokenizer's Decode writes it (at word level, words joined by spaces).
  ev.after_word = after_word_;
  absl::StatusOr<std::string> bytes = lease.model->tokenizer().AppendedText(token, &after_word_);
  if (grammar_) grammar_->Advance(bytes.ok() ? *bytes : std::string());  // the mask allowed it
  TextStream::Update text = text_.Push(bytes.ok() ? *bytes : std::string());
  ev.text = std::move(text.text);
  const absl::Time now = absl::Now();
  if (SchedulerObserver* o = runner.observer()) {
    o->OnTokensGenerated(1);
    if (lease.model != nullptr) o->OnModelTokenGenerated(lease.model->ref());
    if (generated_tokens_ == 0) {
      o->OnFirstToken(SecondsSince(started_));
    } else {
      o->OnInterTokenGap(absl::ToDoubleSeconds(now - last_token_at_));
    }
  }
  if (generated_tokens_ == 0) times.first_token_seconds = SecondsSince(started_);
  last_token_at_ = now;
  decoding_ = true;
  last_ = token;
  ++generated_tokens_;
  const int64_t position = lease.state->position() + 1;  // the sampled token, pending
  generated.push_back(token);
  LogHistory(runner, position);
  runner.SendTokens(*this, callbacks_.on_tokens, std::move(ev), position);
  // The end of the prompt, kept once its first token is on its way (the copy is not in its latency).
  if (first && lease.throwaway) runner.KeepInStateCache(lease, feed, {});

  const bool stop_token =
      std::find(spec_.stop_token_ids.begin(), spec_.stop_token_ids.end(), token) != spec_.stop_token_ids.end();
  if (text.stopped) {
    finish_ = Finish::kStopSequence;
  } else if (stop_token || (grammar_ && grammar_->Complete())) {  // a whole root ends it as a stop token does
    finish_ = Finish::kStopToken;
  } else if (generated_tokens_ >= spec_.max_new_tokens) {
    finish_ = Finish::kLength;
  } else if (cancelled.load()) {
    finish_ = Finish::kCancelled;
  } else {
    if (grammar_) {  // the next token's mask, before a step feeds this one: a dead end ends the call here
      absl::StatusOr<std::shared_ptr<const TokenMask>> next = NextMask();
      if (!next.ok()) {
        runner.Finish(*this, next.status());
        return;
      }
      mask_ = *std::move(next);
    }
    return;
  }
  if (lease.throwaway && finish_ != Finish::kCancelled) {  // the end of the generation, its last token pending
    std::vector<int> all = feed;
    all.insert(all.end(), generated.begin(), generated.end());
    runner.KeepInStateCache(lease, all, {token});
  }
  runner.Finish(*this, absl::OkStatus());
}

void GenerateJob::Settle(const absl::Status& status) {
  // A cancel (or a stall) that ended it before a step could.
  if (!finish_) finish_ = cancelled.load() || IsStalled(status) ? Finish::kCancelled : Finish::kLength;
  if (!decoding_ && spec_.max_new_tokens == 0 && status.ok() && !feed.empty() && fed + 1 == feed.size()) {
    lease.pending = {feed.back()};  // all but the last fed; the last pending
    return;
  }
  if (decoding_) {
    lease.pending = {last_};  // the last sampled token is never fed by this job
    if (finish_ != Finish::kStopSequence) trailing_text_ = text_.Finish();
  } else if (fed > 0) {
    KeepFedPrefix();
  } else {
    lease.pending.assign(feed.begin(), feed.begin() + pending_len);
  }
}

Job::Answer GenerateJob::TakeAnswer() {
  if (!callbacks_.on_done) return nullptr;
  GenerateResult r;
  r.session_id = lease.id;
  r.finish = finish_.value_or(Finish::kLength);
  r.input_tokens = input_tokens();
  r.generated_tokens = generated_tokens_;
  r.times = times;
  r.trailing_text = std::move(trailing_text_);
  if (spec_.max_new_tokens == 0) r.echo = std::move(echo_);  // else the first token's event took it
  return [done = std::move(callbacks_.on_done), r = std::move(r)](absl::Status status, int64_t position) mutable {
    r.position = position;
    done(std::move(status), std::move(r));
  };
}

}  // namespace txl
