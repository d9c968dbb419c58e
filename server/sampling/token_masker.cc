#include "server/sampling/token_masker.h"

#include <utility>

namespace txl {

std::shared_ptr<TokenMasker> TokenMasker::Create(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer,
                                                 const TokenMaskerLimits& limits) {
  return std::shared_ptr<TokenMasker>(new TokenMasker(std::move(grammar), tokenizer, limits));
}

TokenMasker::TokenMasker(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer,
                         const TokenMaskerLimits& limits)
    : tokenizer_(tokenizer), limits_(limits), start_(std::move(grammar)) {}

void TokenMasker::Reset() {
  nodes_.clear();
  ids_.clear();
  stack_positions_ = 0;
  mask_bytes_ = 0;
}

namespace {

int64_t Positions(const std::vector<GrammarState::Stack>& stacks) {
  int64_t n = 0;
  for (const auto& s : stacks) n += static_cast<int64_t>(s.size()) + 1;
  return n;
}

}  // namespace

int TokenMasker::Intern(Stacks stacks, size_t depth) {
  if (stacks.empty()) return kDead;
  auto it = ids_.find(stacks);
  if (it != ids_.end()) return it->second;
  const int64_t positions = Positions(stacks);
  if (static_cast<int>(nodes_.size()) >= limits_.max_states ||
      stack_positions_ + positions > limits_.max_stack_positions) {
    ++stats_.unremembered;
    if (path_.size() <= depth) path_.resize(depth + 1);
    path_[depth] = std::move(stacks);
    return kUnremembered - static_cast<int>(depth);
  }
  const int id = static_cast<int>(nodes_.size());
  auto node = std::make_unique<Node>();
  node->next.fill(kUnknown);
  auto [where, inserted] = ids_.emplace(std::move(stacks), id);
  node->stacks = &where->first;
  nodes_.push_back(std::move(node));
  stack_positions_ += positions;
  return id;
}

const TokenMasker::Stacks& TokenMasker::StacksOf(int node) const {
  return node >= 0 ? *nodes_[static_cast<size_t>(node)]->stacks : path_[static_cast<size_t>(kUnremembered - node)];
}

int TokenMasker::Go(int node, unsigned char byte, size_t depth) {
  if (node >= 0) {
    const int32_t next = nodes_[static_cast<size_t>(node)]->next[byte];
    if (next != kUnknown) return next;
  }
  const int to = Intern(start_.Step(StacksOf(node), byte), depth + 1);
  // Only a step between remembered sets is remembered (Intern may have grown nodes_).
  if (node >= 0 && to >= kDead) nodes_[static_cast<size_t>(node)]->next[byte] = to;
  return to;
}

namespace {

// A mask that allows nothing yet, for a vocabulary of n tokens.
std::shared_ptr<TokenMask> NoToken(size_t n) {
  auto mask = std::make_shared<TokenMask>();
  mask->bits.words.assign((n + 63) / 64, 0);
  mask->vocab = static_cast<int64_t>(n);
  return mask;
}

void Allow(TokenMask& mask, int id) {
  mask.bits.words[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  ++mask.count;
}

}  // namespace

std::shared_ptr<const TokenMask> TokenMasker::Walk(int node, bool after_word, bool first_only) {
  const std::vector<std::string>& symbols = tokenizer_.symbols();
  std::shared_ptr<TokenMask> mask = NoToken(symbols.size());
  const bool words = tokenizer_.kind() == TokenizerKind::kWord;
  if (words && tokenizer_.eos_id() >= 0 && Go(node, '\n', 0) != kDead) {  // <eos> is a newline, never spaced
    Allow(*mask, tokenizer_.eos_id());
    if (first_only) return mask;
  }
  // A symbol's bytes are at depths 1.. (a spaced word's space at 1, its first
  // byte at 2): the depths index path_ for the sets not remembered.
  const size_t base = words && after_word ? 1 : 0;
  const int from = base == 1 ? Go(node, ' ', 0) : node;
  if (from == kDead) return mask;
  const std::vector<int>& order = tokenizer_.ids_in_text_order();
  const std::vector<int>& shared = tokenizer_.shared_prefix();
  // at[d]: the node after the symbol's first d bytes (kDead once refused;
  // nothing is kept past a refusal, so a symbol sharing that prefix is refused
  // as soon as it is reached).
  std::vector<int> at = {from};
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string& symbol = symbols[static_cast<size_t>(order[i])];
    const size_t keep = static_cast<size_t>(shared[i]) + 1;
    if (at.size() > keep) at.resize(keep);
    int state = at.back();
    while (state != kDead && at.size() <= symbol.size()) {
      state = Go(state, static_cast<unsigned char>(symbol[at.size() - 1]), base + at.size() - 1);
      at.push_back(state);
    }
    if (state != kDead && !symbol.empty() && at.size() == symbol.size() + 1) {
      Allow(*mask, order[i]);
      if (first_only) return mask;
    }
  }
  return mask;
}

std::shared_ptr<const TokenMask> TokenMasker::Next(const GrammarState& state, bool after_word) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(nodes_.size()) >= limits_.max_states) Reset();  // the automaton starts again
  const int node = Intern(state.stacks_, 0);
  if (node == kDead) {  // nothing may follow: no token
    return NoToken(tokenizer_.symbols().size());
  }
  const bool spaced = after_word && tokenizer_.kind() == TokenizerKind::kWord;
  if (node < 0) return Walk(node, spaced, /*first_only=*/false);  // a place past the limits: not kept
  if (auto kept = nodes_[static_cast<size_t>(node)]->masks[spaced]; kept != nullptr) {
    ++stats_.reused;
    return kept;
  }
  std::shared_ptr<const TokenMask> mask = Walk(node, spaced, /*first_only=*/false);
  ++stats_.walks;
  const int64_t bytes = static_cast<int64_t>(mask->bits.words.size() * 8);
  if (mask_bytes_ + bytes > limits_.max_mask_bytes) {  // drop the kept masks, keep the automaton
    for (auto& n : nodes_) {
      for (auto& m : n->masks) {
        if (m != nullptr) ++stats_.masks_dropped;
        m = nullptr;
      }
    }
    mask_bytes_ = 0;
  }
  // Walk may have grown nodes_; the node's index still holds.
  nodes_[static_cast<size_t>(node)]->masks[spaced] = mask;
  mask_bytes_ += bytes;
  return mask;
}

bool TokenMasker::SomeTokenCanBegin() {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(nodes_.size()) >= limits_.max_states) Reset();
  const int node = Intern(start_.stacks_, 0);
  if (node == kDead) return false;
  if (Walk(node, false, /*first_only=*/true)->count > 0) return true;
  return tokenizer_.kind() == TokenizerKind::kWord && Walk(node, true, /*first_only=*/true)->count > 0;
}

TokenMasker::Stats TokenMasker::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.states = static_cast<int>(nodes_.size());
  s.mask_bytes = mask_bytes_;
  return s;
}

}  // namespace txl
