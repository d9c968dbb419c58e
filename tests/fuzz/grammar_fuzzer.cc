// libFuzzer target: the grammar notation (server/sampling/grammar.h) and the
// states it makes. Beyond "no crash, no sanitizer report", hang or runaway
// memory, it checks what the header promises:
//   a refusal is INVALID_ARGUMENT starting "grammar: ";
//   Allows(x) is whether Advance(x) succeeds, and a refused Advance leaves
//   the state as it was;
//   every prefix of an advanced text was allowed;
//   TokenMasker's masks, on a byte vocabulary and on a word vocabulary made
//   of the text's pieces (in both word contexts, past its small limits),
//   equal the token-by-token check.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: a grammar, then (after its first NUL byte, if any) a text to read.
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "server/sampling/grammar.h"
#include "server/sampling/token_masker.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "grammar_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
}

// The masker's mask against Allows for each token's text.
void CheckMask(txl::TokenMasker& masker, const txl::Tokenizer& tok, const txl::GrammarState& state, bool after_word) {
  const auto mask = masker.Next(state, after_word);
  int64_t count = 0;
  for (int id = 0; id < tok.vocab_size(); ++id) {
    bool spaced = after_word;
    const std::string text = *tok.AppendedText(id, &spaced);
    const bool want = !text.empty() && state.Allows(text);
    Check(mask->bits.contains(id) == want, "a mask is the token-by-token check");
    count += want;
  }
  Check(mask->count == count, "a mask counts what it allows");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string grammar = input.substr(0, nul);
  const std::string text = nul == std::string::npos ? "" : input.substr(nul + 1);
  txl::GrammarLimits limits;
  limits.max_text_bytes = 4096;
  limits.max_rules = 256;
  limits.max_stacks = 64;
  auto g = txl::Grammar::Parse(grammar, limits);
  if (!g.ok()) {
    Check(g.status().code() == absl::StatusCode::kInvalidArgument, "a refusal is INVALID_ARGUMENT");
    Check(g.status().message().rfind("grammar: ", 0) == 0, "a refusal starts with grammar:");
    return 0;
  }
  // Words: the text's 3-byte pieces without blanks, and <eos>.
  std::set<std::string> pieces = {"<eos>"};
  for (size_t i = 0; i < text.size() && i < 512; i += 3) {
    const std::string piece = text.substr(i, 3);
    if (piece.find_first_of(" \t\n\r\f\v") == std::string::npos) pieces.insert(piece);
  }
  auto words = txl::Tokenizer::WordFromSymbols(std::vector<std::string>(pieces.begin(), pieces.end()));
  const txl::Tokenizer bytes = txl::Tokenizer::Byte();
  txl::TokenMaskerLimits small;
  small.max_states = 8;
  small.max_stack_positions = 64;
  small.max_mask_bytes = 64;
  auto byte_masker = txl::TokenMasker::Create(*g, bytes, small);
  auto word_masker = words.ok() ? txl::TokenMasker::Create(*g, *words, small) : nullptr;
  txl::GrammarState state(*g);
  for (size_t i = 0; i < text.size() && i < 512; i += 3) {
    const std::string piece = text.substr(i, 3);
    if (i < 48) {  // the masks at the first places (each checks the whole vocabulary)
      CheckMask(*byte_masker, bytes, state, false);
      if (word_masker != nullptr) {
        CheckMask(*word_masker, *words, state, false);
        CheckMask(*word_masker, *words, state, true);
      }
    }
    const bool allowed = state.Allows(piece);
    const bool complete = state.Complete(), more = state.CanContinue();
    const bool advanced = state.Advance(piece);
    Check(allowed == advanced, "Allows(x) is whether Advance(x) succeeds");
    if (!advanced) {
      Check(state.Complete() == complete && state.CanContinue() == more, "a refused Advance changes nothing");
      Check(!state.Allows(piece), "a refused text stays refused");
      break;
    }
    Check(state.Complete() || state.CanContinue(), "an advanced state is whole or can go on");
  }
  return 0;
}
