// A fake Engine for scheduler tests: a "counting" language model whose most
// likely next token is (last token + 1) mod V, with every fed token recorded.
// Its states depend on their last token only, so any replay of at least one
// token is exact; it reports the receptive field of a two-layer model, so
// tests see how many tokens a replay feeds.
#ifndef TXL_TESTS_SERVER_FAKE_ENGINE_H_
#define TXL_TESTS_SERVER_FAKE_ENGINE_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/engine/engine.h"
#include "server/engine/served_model.h"
#include "server/sampling/sampler.h"

namespace txl::testing {

class FakeSession : public SessionState {
 public:
  explicit FakeSession(int64_t mem_len, int64_t start = 0) : start(start), mem_len_(mem_len) {}
  int64_t position() const override { return start + static_cast<int64_t>(history.size()); }
  int64_t mem_len() const override { return mem_len_; }
  int64_t memory_tokens() const override { return std::min<int64_t>(history.size(), mem_len_ - 1); }
  int64_t memory_bytes() const override { return memory_tokens() * 8; }
  int64_t full_memory_bytes() const override { return (mem_len_ - 1) * 8; }
  absl::StatusOr<std::unique_ptr<SessionState>> Clone() const override {
    if (fail_clone) return absl::ResourceExhaustedError("injected: no memory for a copy");
    auto c = std::make_unique<FakeSession>(mem_len_, start);
    c->history = history;
    return std::unique_ptr<SessionState>(std::move(c));
  }
  // Image: mem_len, "@start" when the history began later than 0, then the
  // tokens fed, as text.
  absl::Status AppendTo(std::string* out) const override {
    out->append(std::to_string(mem_len_));
    if (start > 0) out->append(" @" + std::to_string(start));
    for (int t : history) out->append(" " + std::to_string(t));
    return absl::OkStatus();
  }
  int64_t start = 0;         // the position the first fed token had
  std::vector<int> history;  // the tokens fed
  bool fail_clone = false;

 private:
  int64_t mem_len_;
};

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(int64_t vocab = 256) : vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  absl::StatusOr<std::unique_ptr<SessionState>> NewSession(int64_t mem_len) override {
    return std::unique_ptr<SessionState>(new FakeSession(mem_len));
  }
  absl::StatusOr<std::unique_ptr<SessionState>> NewSessionAt(int64_t mem_len, int64_t position) override {
    return std::unique_ptr<SessionState>(new FakeSession(mem_len, position));
  }
  int64_t ReceptiveField(int64_t mem_len) const override { return 2 * (mem_len - 1); }
  int64_t FullMemoryBytes(int64_t mem_len) const override { return FakeSession(mem_len).full_memory_bytes(); }

  absl::StatusOr<std::unique_ptr<SessionState>> RestoreSession(const std::string& data) override {
    std::istringstream in(data);
    int64_t mem_len = 0;
    if (!(in >> mem_len) || mem_len < 1) return absl::InvalidArgumentError("fake state: bad image");
    auto s = std::make_unique<FakeSession>(mem_len);
    if (in >> std::ws && in.peek() == '@') {
      in.get();
      if (!(in >> s->start) || s->start < 0) return absl::InvalidArgumentError("fake state: bad image");
    }
    for (int t; in >> t;) s->history.push_back(t);
    return std::unique_ptr<SessionState>(std::move(s));
  }
  std::string fingerprint() const override { return "fake-" + std::to_string(vocab_); }
  std::string numerics() const override { return "exact"; }

  // log p(next | last): 0.9 on last + 1, the rest spread evenly.
  std::vector<float> Distribution(int last) const {
    std::vector<float> d(vocab_, std::log(0.1f / static_cast<float>(vocab_ - 1)));
    d[(last + 1) % vocab_] = std::log(0.9f);
    return d;
  }

  absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<StepInput> inputs) override {
    absl::MutexLock lock(&mu_);
    if (!fail_next_.ok()) return std::exchange(fail_next_, absl::OkStatus());
    std::vector<StepOutput> out(inputs.size());
    int64_t tokens = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto* s = static_cast<FakeSession*>(inputs[i].session);
      for (size_t t = 0; t < inputs[i].tokens.size(); ++t) {
        s->history.push_back(inputs[i].tokens[t]);
        if (t < inputs[i].targets.size())
          out[i].target_logprobs.push_back(Distribution(inputs[i].tokens[t])[inputs[i].targets[t]]);
      }
      if (inputs[i].want_last_distribution) {
        out[i].last_distribution = Distribution(s->history.back());
        ++distributions_;
      }
      // Picks as the model makes them (model/net/output_layer.h), from the same distribution.
      if (inputs[i].plan.pick != SamplingPlan::Pick::kNone) {
        const std::vector<float> d = Distribution(s->history.back());
        out[i].picked = inputs[i].plan.pick == SamplingPlan::Pick::kArgmax
                            ? static_cast<int>(std::max_element(d.begin(), d.end()) - d.begin())
                            : DrawInIdOrder(d.data(), static_cast<int64_t>(d.size()), inputs[i].plan.temperature,
                                            inputs[i].plan.uniform);
        // A constraint, as the model applies it (SamplingPlan::allowed).
        out[i].picked = ConstrainedPick(d.data(), static_cast<int64_t>(d.size()), inputs[i].plan, out[i].picked);
        if (out[i].picked < 0) return absl::InternalError("fake engine: the constraint allows no token");
        out[i].picked_logprob = d[out[i].picked];
        ++picks_;
      }
      if (inputs[i].plan.nucleus_p > 0) {
        // Exactly the nucleus, and the total as the sampler sums it.
        const std::vector<float> d = Distribution(s->history.back());
        const TokenList sorted = TopN(d, vocab_);
        const double best = sorted[0].second, t = inputs[i].plan.temperature;
        double total = 0, mass = 0;
        for (float lp : d) total += std::exp((lp - best) / t);
        for (const auto& [id, lp] : sorted) {
          out[i].nucleus.emplace_back(id, lp);
          mass += std::exp((lp - best) / t) / total;
          if (mass >= inputs[i].plan.nucleus_p) break;
        }
        out[i].nucleus_total = total;
        ++lists_;
      }
      if (inputs[i].plan.top_n > 0) {
        out[i].top = TopN(Distribution(s->history.back()), inputs[i].plan.top_n);
        ++lists_;
      }
      tokens += static_cast<int64_t>(inputs[i].tokens.size());
    }
    steps_.push_back({static_cast<int>(inputs.size()), tokens});
    return out;
  }

  void FailNextStep(absl::Status status = absl::InternalError("injected engine failure")) {
    absl::MutexLock lock(&mu_);
    fail_next_ = std::move(status);
  }
  struct StepRecord {
    int rows;
    int64_t tokens;
  };
  std::vector<StepRecord> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  // Rows that asked for a whole distribution, and for a pick.
  int64_t distributions() const {
    absl::MutexLock lock(&mu_);
    return distributions_;
  }
  int64_t picks() const {
    absl::MutexLock lock(&mu_);
    return picks_;
  }
  // Rows that asked for their top tokens or a nucleus.
  int64_t lists() const {
    absl::MutexLock lock(&mu_);
    return lists_;
  }

 private:
  const int64_t vocab_;
  mutable absl::Mutex mu_;
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
  std::vector<StepRecord> steps_ ABSL_GUARDED_BY(mu_);
  int64_t distributions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t picks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lists_ ABSL_GUARDED_BY(mu_) = 0;
};

// A model version served by a FakeEngine of `vocab` tokens (its fingerprint
// "fake-<vocab>"), with the byte tokenizer.
inline std::shared_ptr<ServedModel> FakeServed(const std::string& name = "fake", int64_t version = 1,
                                               int64_t vocab = 256) {
  ModelConfig config;
  config.n_token = vocab;
  return std::make_shared<ServedModel>(name, version, std::make_unique<FakeEngine>(vocab), config, Tokenizer::Byte());
}
inline FakeEngine& FakeOf(const ServedModel& served) { return static_cast<FakeEngine&>(*served.engine()); }

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_FAKE_ENGINE_H_
