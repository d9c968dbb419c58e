#include "server/sampling/grammar.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace txl {

class GrammarParser {
 public:
  GrammarParser(absl::string_view text, const GrammarLimits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Run();

 private:
  using Element = Grammar::Element;
  using Sequence = std::vector<Element>;
  using Alternatives = std::vector<Sequence>;

  absl::Status Error(size_t at, absl::string_view what) const;
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }
  // Spaces, tabs, line ends and comments; `lines` false: spaces and tabs only.
  void SkipSpace(bool lines = true);
  // Whether a `name ::=` starts here (nothing is read).
  bool AtRuleStart() const;
  std::string Name();
  absl::StatusOr<Alternatives> ParseAlternatives(const std::string& base, bool in_group);
  absl::StatusOr<Sequence> ParseItem(const std::string& base);
  absl::StatusOr<unsigned char> ParseEscape();
  absl::StatusOr<Sequence> ParseLiteral();
  absl::StatusOr<Element> ParseClass();
  // The id of the named rule `name` (made on its first mention at `at`).
  int Named(const std::string& name, size_t at);
  // A new rule for a group or repetition inside rule `base`.
  absl::StatusOr<int> Made(const std::string& base, Alternatives alternatives);
  static Element RuleRef(int rule) {
    Element e;
    e.is_rule = true;
    e.rule = rule;
    return e;
  }
  std::string Shown(int rule) const;  // a made rule by the rule it is in
  absl::Status CheckLeftRecursion(const std::vector<bool>& nullable) const;

  absl::string_view text_;
  const GrammarLimits limits_;
  size_t pos_ = 0;
  int nesting_ = 0;  // groups open at pos_
  std::vector<Grammar::Rule> rules_;
  std::vector<bool> defined_;
  std::vector<size_t> mentioned_at_;
  std::vector<bool> made_;
  std::map<std::string, int> ids_;
};

absl::Status GrammarParser::Error(size_t at, absl::string_view what) const {
  at = std::min(at, text_.size());
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < at; ++i) {
    if (text_[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, ", column ", at - line_start + 1, ": ", what));
}

void GrammarParser::SkipSpace(bool lines) {
  while (!AtEnd()) {
    const char c = Peek();
    if (c == ' ' || c == '\t' || (lines && (c == '\n' || c == '\r'))) {
      ++pos_;
    } else if (c == '#' && lines) {
      while (!AtEnd() && Peek() != '\n') ++pos_;
    } else {
      return;
    }
  }
}

bool GrammarParser::AtRuleStart() const {
  size_t p = pos_;
  while (p < text_.size() && IsNameChar(text_[p])) ++p;
  if (p == pos_) return false;
  while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
  return text_.substr(p, 3) == "::=";
}

std::string GrammarParser::Name() {
  const size_t start = pos_;
  while (!AtEnd() && IsNameChar(Peek())) ++pos_;
  return std::string(text_.substr(start, pos_ - start));
}

int GrammarParser::Named(const std::string& name, size_t at) {
  auto [it, added] = ids_.emplace(name, static_cast<int>(rules_.size()));
  if (added) {
    rules_.push_back({name, {}});
    defined_.push_back(false);
    mentioned_at_.push_back(at);
    made_.push_back(false);
  }
  return it->second;
}

absl::StatusOr<int> GrammarParser::Made(const std::string& base, Alternatives alternatives) {
  if (static_cast<int>(rules_.size()) >= limits_.max_rules) {
    return Error(pos_, absl::StrCat("more than ", limits_.max_rules, " rules (groups and repetitions count)"));
  }
  rules_.push_back({absl::StrCat(base, "#", rules_.size()), std::move(alternatives)});
  defined_.push_back(true);
  mentioned_at_.push_back(pos_);
  made_.push_back(true);
  return static_cast<int>(rules_.size()) - 1;
}

std::string GrammarParser::Shown(int rule) const {
  const std::string& name = rules_[static_cast<size_t>(rule)].name;
  return made_[static_cast<size_t>(rule)] ? name.substr(0, name.find('#')) + " (a group or repetition in it)" : name;
}

absl::StatusOr<unsigned char> GrammarParser::ParseEscape() {
  const size_t at = pos_;
  ++pos_;  // the backslash
  if (AtEnd()) return Error(at, "a '\\' ends the grammar");
  const char c = Peek();
  ++pos_;
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '^': return static_cast<unsigned char>(c);
    case 'x': {
      int value = 0;
      for (int i = 0; i < 2; ++i) {
        if (AtEnd() || !std::isxdigit(static_cast<unsigned char>(Peek()))) {
          return Error(at, "\\x takes two hex digits");
        }
        const char h = Peek();
        value = value * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
        ++pos_;
      }
      return static_cast<unsigned char>(value);
    }
    default: return Error(at, absl::StrCat("unknown escape '\\", std::string(1, c), "'"));
  }
}

absl::StatusOr<GrammarParser::Sequence> GrammarParser::ParseLiteral() {
  const size_t at = pos_;
  ++pos_;  // the opening quote
  Sequence seq;
  while (true) {
    if (AtEnd()) return Error(at, "a literal is not closed (\")");
    const char c = Peek();
    if (c == '"') break;
    unsigned char byte = static_cast<unsigned char>(c);
    if (c == '\\') {
      auto escaped = ParseEscape();
      if (!escaped.ok()) return escaped.status();
      byte = *escaped;
    } else {
      ++pos_;
    }
    Element e;
    e.bytes.set(byte);
    seq.push_back(e);
  }
  ++pos_;  // the closing quote
  return seq;
}

absl::StatusOr<GrammarParser::Element> GrammarParser::ParseClass() {
  const size_t at = pos_;
  ++pos_;  // [
  Element e;
  const bool negated = !AtEnd() && Peek() == '^';
  if (negated) ++pos_;
  auto one = [&]() -> absl::StatusOr<unsigned char> {
    if (Peek() == '\\') return ParseEscape();
    const unsigned char c = static_cast<unsigned char>(Peek());
    if (c >= 0x80) return Error(pos_, "a class holds ASCII characters (non-ASCII text goes in a literal)");
    ++pos_;
    return c;
  };
  bool any = false;
  while (true) {
    if (AtEnd()) return Error(at, "a class is not closed (])");
    if (Peek() == ']') break;
    auto low = one();
    if (!low.ok()) return low.status();
    unsigned char high = *low;
    if (pos_ + 1 < text_.size() && Peek() == '-' && text_[pos_ + 1] != ']') {
      ++pos_;
      auto h = one();
      if (!h.ok()) return h.status();
      high = *h;
      if (high < *low) return Error(at, "a range in a class runs backwards");
    }
    for (int b = *low; b <= high; ++b) e.bytes.set(static_cast<size_t>(b));
    any = true;
  }
  ++pos_;  // ]
  if (!any) return Error(at, "an empty class ([])");
  if (negated) e.bytes.flip();
  if (e.bytes.none()) return Error(at, "a class that matches no byte");
  return e;
}

absl::StatusOr<GrammarParser::Sequence> GrammarParser::ParseItem(const std::string& base) {
  const size_t at = pos_;
  const char c = Peek();
  Sequence seq;
  if (c == '"') {
    auto literal = ParseLiteral();
    if (!literal.ok()) return literal.status();
    seq = *std::move(literal);
  } else if (c == '[') {
    auto cls = ParseClass();
    if (!cls.ok()) return cls.status();
    seq.push_back(*cls);
  } else if (c == '.') {
    ++pos_;
    Element any;
    any.bytes.set();
    seq.push_back(any);
  } else if (c == '(') {
    if (++nesting_ > limits_.max_nesting) {
      return Error(at, absl::StrCat("groups nested more than ", limits_.max_nesting, " deep"));
    }
    ++pos_;
    auto group = ParseAlternatives(base, /*in_group=*/true);
    --nesting_;
    if (!group.ok()) return group.status();
    ++pos_;  // ), which ParseAlternatives found
    auto id = Made(base, *std::move(group));
    if (!id.ok()) return id.status();
    seq.push_back(RuleRef(*id));
  } else if (IsNameChar(c)) {
    seq.push_back(RuleRef(Named(Name(), at)));
  } else {
    return Error(at, absl::StrCat("unexpected '", std::string(1, c), "'"));
  }
  SkipSpace(/*lines=*/false);
  if (AtEnd() || (Peek() != '*' && Peek() != '+' && Peek() != '?')) return seq;
  const char op = Peek();
  ++pos_;
  // X* is R ::= X R | (nothing); X+ is R ::= X R | X; X? is R ::= X | (nothing).
  auto id = Made(base, {});
  if (!id.ok()) return id.status();
  Sequence more = seq;
  more.push_back(RuleRef(*id));
  Alternatives& alts = rules_[static_cast<size_t>(*id)].alternatives;
  if (op == '*') alts = {more, {}};
  if (op == '+') alts = {more, seq};
  if (op == '?') alts = {seq, {}};
  return Sequence{RuleRef(*id)};
}

absl::StatusOr<GrammarParser::Alternatives> GrammarParser::ParseAlternatives(const std::string& base, bool in_group) {
  const size_t at = pos_;
  Alternatives alts(1);
  while (true) {
    SkipSpace();
    if (AtEnd()) {
      if (in_group) return Error(at - 1, "a group is not closed ())");  // at its (
      break;
    }
    const char c = Peek();
    if (c == '|') {
      ++pos_;
      alts.emplace_back();
      continue;
    }
    if (c == ')') {
      if (!in_group) return Error(pos_, "')' without '('");
      break;
    }
    if (!in_group && AtRuleStart()) break;
    auto item = ParseItem(base);
    if (!item.ok()) return item.status();
    alts.back().insert(alts.back().end(), item->begin(), item->end());
  }
  return alts;
}

absl::Status GrammarParser::CheckLeftRecursion(const std::vector<bool>& nullable) const {
  // Rule r can begin with rule q: q comes first in one of r's alternatives,
  // after only elements that can be empty.
  const size_t n = rules_.size();
  std::vector<std::vector<int>> first(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r].alternatives) {
      for (const Element& e : alt) {
        if (!e.is_rule) break;
        first[r].push_back(e.rule);
        if (!nullable[static_cast<size_t>(e.rule)]) break;
      }
    }
  }
  std::vector<int> color(n, 0);  // 0: unseen, 1: on the path, 2: done
  std::vector<int> path;
  absl::Status found;
  std::function<bool(int)> visit = [&](int r) {
    color[static_cast<size_t>(r)] = 1;
    path.push_back(r);
    for (int q : first[static_cast<size_t>(r)]) {
      if (color[static_cast<size_t>(q)] == 1) {
        std::vector<std::string> names;
        for (auto it = std::find(path.begin(), path.end(), q); it != path.end(); ++it) names.push_back(Shown(*it));
        names.push_back(Shown(q));
        found = Error(mentioned_at_[static_cast<size_t>(q)],
                      absl::StrCat("rule '", Shown(q), "' is left-recursive (", absl::StrJoin(names, " -> "),
                                   "): a rule cannot begin with itself; write the repetition with *, + or a "
                                   "rule that recurses on its right"));
        return true;
      }
      if (color[static_cast<size_t>(q)] == 0 && visit(q)) return true;
    }
    path.pop_back();
    color[static_cast<size_t>(r)] = 2;
    return false;
  };
  for (size_t r = 0; r < n; ++r) {
    if (color[r] == 0 && visit(static_cast<int>(r))) return found;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Grammar>> GrammarParser::Run() {
  if (static_cast<int64_t>(text_.size()) > limits_.max_text_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: ", text_.size(), " bytes, more than the limit of ", limits_.max_text_bytes));
  }
  SkipSpace();
  if (AtEnd()) return Error(0, "the grammar is empty: it needs a rule named root");
  while (!AtEnd()) {
    const size_t at = pos_;
    const std::string name = Name();
    if (name.empty()) return Error(at, "expected a rule's name");
    SkipSpace(/*lines=*/false);
    if (text_.substr(pos_, 3) != "::=") return Error(pos_, absl::StrCat("expected ::= after '", name, "'"));
    pos_ += 3;
    const int id = Named(name, at);
    if (defined_[static_cast<size_t>(id)]) return Error(at, absl::StrCat("rule '", name, "' is defined twice"));
    defined_[static_cast<size_t>(id)] = true;
    auto alts = ParseAlternatives(name, /*in_group=*/false);
    if (!alts.ok()) return alts.status();
    rules_[static_cast<size_t>(id)].alternatives = *std::move(alts);
    if (static_cast<int>(rules_.size()) > limits_.max_rules) {
      return Error(at, absl::StrCat("more than ", limits_.max_rules, " rules (groups and repetitions count)"));
    }
    SkipSpace();
  }
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (!defined_[r])
      return Error(mentioned_at_[r], absl::StrCat("rule '", rules_[r].name, "' is used but not defined"));
  }
  auto root = ids_.find("root");
  if (root == ids_.end()) return Error(0, "no rule named root (where a text starts)");
  // Which rules can be empty, and which derive some finite text.
  std::vector<bool> nullable(rules_.size(), false), productive(rules_.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Sequence& alt : rules_[r].alternatives) {
        bool empty = true, finite = true;
        for (const Element& e : alt) {
          empty = empty && e.is_rule && nullable[static_cast<size_t>(e.rule)];
          finite = finite && (!e.is_rule || productive[static_cast<size_t>(e.rule)]);
        }
        if (empty && !nullable[r]) nullable[r] = changed = true;
        if (finite && !productive[r]) productive[r] = changed = true;
      }
    }
  }
  if (absl::Status s = CheckLeftRecursion(nullable); !s.ok()) return s;
  if (!productive[static_cast<size_t>(root->second)]) {
    return Error(0, "root derives no finite text (every alternative needs a rule that never ends)");
  }
  // An alternative that needs a rule that never ends can never be whole:
  // dropped, so that a text cut short is always a valid beginning. A rule
  // that derives some text keeps at least one alternative.
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (!productive[r]) continue;
    auto& alts = rules_[r].alternatives;
    alts.erase(std::remove_if(alts.begin(), alts.end(),
                              [&](const Sequence& alt) {
                                return std::any_of(alt.begin(), alt.end(), [&](const Element& e) {
                                  return e.is_rule && !productive[static_cast<size_t>(e.rule)];
                                });
                              }),
               alts.end());
  }
  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->rules_ = std::move(rules_);
  g->root_ = root->second;
  g->limits_ = limits_;
  std::shared_ptr<const Grammar> grammar = std::move(g);
  if (GrammarState(grammar).truncated()) {
    return Error(0, absl::StrCat("the grammar is too ambiguous: its start alone takes more than ",
                                 limits_.max_steps_per_byte, " steps (rules that can match nothing, in many ways)"));
  }
  return grammar;
}

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::Parse(absl::string_view text, const GrammarLimits& limits) {
  return GrammarParser(text, limits).Run();
}

bool GrammarState::Position::operator<(const Position& o) const {
  return std::tie(rule, alternative, element) < std::tie(o.rule, o.alternative, o.element);
}

bool GrammarState::Position::operator==(const Position& o) const {
  return rule == o.rule && alternative == o.alternative && element == o.element;
}

namespace {

void Dedupe(std::vector<GrammarState::Stack>* stacks, int limit) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
  // Past the limit the last parses go: what is left still reads only valid text.
  if (static_cast<int>(stacks->size()) > limit) stacks->resize(static_cast<size_t>(limit));
}

}  // namespace

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  const auto& root = grammar_->rules()[static_cast<size_t>(grammar_->root())];
  int budget = grammar_->limits().max_steps_per_byte;
  for (size_t a = 0; a < root.alternatives.size(); ++a) {
    Expand({Position{grammar_->root(), static_cast<int>(a), 0}}, &stacks_, &budget);
  }
  Dedupe(&stacks_, grammar_->limits().max_stacks);
}

void GrammarState::Expand(Stack stack, std::vector<Stack>* out, int* budget) const {
  const auto& rules = grammar_->rules();
  const size_t limit = static_cast<size_t>(grammar_->limits().max_stacks) * 4;
  const size_t max_depth = static_cast<size_t>(grammar_->limits().max_depth);
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  while (!work.empty() && out->size() < limit) {
    Stack s = std::move(work.back());
    work.pop_back();
    while (true) {
      if (--*budget < 0) {  // the parses not found yet are dropped (see GrammarLimits)
        truncated_ = true;
        return;
      }
      if (s.size() > max_depth) {  // this parse is dropped
        truncated_ = true;
        break;
      }
      if (s.empty()) {  // root is whole
        out->push_back(std::move(s));
        break;
      }
      Position& p = s.back();
      const auto& alt = rules[static_cast<size_t>(p.rule)].alternatives[static_cast<size_t>(p.alternative)];
      if (p.element == static_cast<int>(alt.size())) {  // this alternative is read: back to its caller
        s.pop_back();
        continue;
      }
      const Grammar::Element& e = alt[static_cast<size_t>(p.element)];
      if (!e.is_rule) {  // a byte set to read next
        out->push_back(std::move(s));
        break;
      }
      ++p.element;
      // Nothing after the rule here: its caller goes on after it (so that a
      // rule recursing on its right, X*'s, does not grow the stack).
      if (p.element == static_cast<int>(alt.size())) s.pop_back();
      const auto& alts = rules[static_cast<size_t>(e.rule)].alternatives;
      for (size_t a = 1; a < alts.size(); ++a) {
        Stack t = s;
        t.push_back(Position{e.rule, static_cast<int>(a), 0});
        work.push_back(std::move(t));
      }
      s.push_back(Position{e.rule, 0, 0});
    }
  }
}

std::vector<GrammarState::Stack> GrammarState::Step(const std::vector<Stack>& stacks, unsigned char byte) const {
  const auto& rules = grammar_->rules();
  std::vector<Stack> out;
  int budget = grammar_->limits().max_steps_per_byte;  // for this byte, all its parses together
  for (const Stack& s : stacks) {
    if (s.empty()) continue;
    const Position& p = s.back();
    const Grammar::Element& e = rules[static_cast<size_t>(p.rule)]
                                    .alternatives[static_cast<size_t>(p.alternative)][static_cast<size_t>(p.element)];
    if (!e.bytes.test(byte)) continue;
    Stack t = s;
    ++t.back().element;
    Expand(std::move(t), &out, &budget);
  }
  Dedupe(&out, grammar_->limits().max_stacks);
  return out;
}

std::bitset<256> GrammarState::NextBytes() const {
  std::bitset<256> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const Position& p = s.back();
    next |= grammar_->rules()[static_cast<size_t>(p.rule)]
                .alternatives[static_cast<size_t>(p.alternative)][static_cast<size_t>(p.element)]
                .bytes;
  }
  return next;
}

bool GrammarState::Allows(absl::string_view text) const {
  if (text.empty()) return true;
  std::vector<Stack> at = Step(stacks_, static_cast<unsigned char>(text[0]));
  for (size_t i = 1; i < text.size() && !at.empty(); ++i) at = Step(at, static_cast<unsigned char>(text[i]));
  return !at.empty();
}

bool GrammarState::Advance(absl::string_view text) {
  std::vector<Stack> at = stacks_;
  for (char c : text) {
    at = Step(at, static_cast<unsigned char>(c));
    if (at.empty()) return false;
  }
  stacks_ = std::move(at);
  return true;
}

bool GrammarState::Complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarState::CanContinue() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return !s.empty(); });
}

}  // namespace txl
