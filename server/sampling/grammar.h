// Grammar: a context-free grammar over bytes in a GBNF-like notation, and
// GrammarState, where a text has reached in it: which next texts it allows
// and whether it is complete: constrained output (GenerateSpec::grammar).
// GenerateJob masks the tokens whose text the state does not allow, and ends
// once the text is a whole root (docs/API_GENERATION.md, "Constrained output").
//
// The notation:
//   # a comment, to the end of the line
//   root   ::= "{" ws pair ("," ws pair)* "}"      one rule; `root` is where a text starts
//   pair   ::= [a-z]+ ws ":" ws value
//   value  ::= "true" | "false" | [0-9]+ | "\"" [^"\\]* "\""
//   ws     ::= [ \t\n]*
// A rule runs until the next `name ::=`. Items: "literal" (UTF-8, matched
// byte by byte), [class] and [^class] of ASCII characters and ranges (a
// negated class matches any other byte, non-ASCII ones included), `.` (any
// byte), a rule's name, ( ... ) groups; each may be followed by *, + or ?.
// Escapes: \n \t \r \\ \" \' \[ \] \- \^ \xHH.
//
// Threading: a Grammar is immutable once parsed; a GrammarState belongs to
// one generation.
#ifndef TXL_SERVER_SAMPLING_GRAMMAR_H_
#define TXL_SERVER_SAMPLING_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

struct GrammarLimits {
  int64_t max_text_bytes = 64 << 10;  // of the grammar's text
  int max_rules = 1024;               // named and made by groups and repetitions
  int max_stacks = 1024;              // parses a state may follow at once (an ambiguous grammar's)
  int max_nesting = 64;               // groups inside groups
  // Work for one byte: the steps taken to find every parse it opens (a
  // grammar with many ways to match nothing could take exponentially many).
  // Past it the parses not found yet are dropped: what is followed still
  // reads only valid text. A grammar whose start passes it is refused.
  int max_steps_per_byte = 20000;
  int max_depth = 4096;  // rules open inside one another in one parse (nesting of the text)
};

class Grammar {
 public:
  // INVALID_ARGUMENT naming what is wrong and where (line and column): a
  // syntax error, a rule used and not defined, no `root`, left recursion
  // (which a byte-at-a-time parse cannot follow), a grammar that derives no
  // finite text, or a limit passed.
  static absl::StatusOr<std::shared_ptr<const Grammar>> Parse(absl::string_view text, const GrammarLimits& limits = {});

  // One item of a sequence: a set of bytes, or a rule.
  struct Element {
    bool is_rule = false;
    int rule = -1;
    std::bitset<256> bytes;
  };
  struct Rule {
    std::string name;  // a made rule's: "name#k"
    std::vector<std::vector<Element>> alternatives;
  };
  const std::vector<Rule>& rules() const { return rules_; }
  int root() const { return root_; }
  const GrammarLimits& limits() const { return limits_; }

 private:
  friend class GrammarParser;
  std::vector<Rule> rules_;
  int root_ = -1;
  GrammarLimits limits_;
};

// Where a text has reached in a grammar: every parse it may still be.
class GrammarState {
 public:
  // The start: nothing read yet.
  explicit GrammarState(std::shared_ptr<const Grammar> grammar);

  // Whether `text` may come next: some parse reads all of it.
  bool Allows(absl::string_view text) const;
  // Reads `text`; false (and the state unchanged) when no parse can.
  bool Advance(absl::string_view text);
  // The text so far is a whole `root`.
  bool Complete() const;
  // Some byte may still follow.
  bool CanContinue() const;
  // The bytes that may come next.
  std::bitset<256> NextBytes() const;
  // Some step ran out of GrammarLimits::max_steps_per_byte (parses were dropped).
  bool truncated() const { return truncated_; }

  // A position in an alternative: the element it reads next.
  struct Position {
    int rule = 0, alternative = 0, element = 0;
    bool operator<(const Position& o) const;
    bool operator==(const Position& o) const;
  };
  // A parse: the innermost position last; empty once `root` is whole.
  using Stack = std::vector<Position>;

 private:
  friend class TokenMasker;  // steps parse sets of its own, and reads a state's
  // The stacks `stack` stands for, each with a byte set on top (or empty),
  // within `*budget` steps (each taken from it).
  void Expand(Stack stack, std::vector<Stack>* out, int* budget) const;
  // The stacks after one byte; empty when none reads it.
  std::vector<Stack> Step(const std::vector<Stack>& stacks, unsigned char byte) const;

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Stack> stacks_;  // sorted, no repeats
  mutable bool truncated_ = false;
};

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_GRAMMAR_H_
