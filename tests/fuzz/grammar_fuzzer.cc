// libFuzzer target: the grammar notation (server/sampling/grammar.h) and the
// states it makes. Beyond "no crash, no sanitizer report", hang or runaway
// memory, it checks what the header promises:
//   a refusal is INVALID_ARGUMENT starting "grammar: ";
//   Allows(x) is whether Advance(x) succeeds, and a refused Advance leaves
//   the state as it was;
//   every prefix of an advanced text was allowed.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: a grammar, then (after its first NUL byte, if any) a text to read.
#include <cstdint>
#include <cstdio>
#include <string>

#include "server/sampling/grammar.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "grammar_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
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
  txl::GrammarState state(*g);
  for (size_t i = 0; i < text.size() && i < 512; i += 3) {
    const std::string piece = text.substr(i, 3);
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
