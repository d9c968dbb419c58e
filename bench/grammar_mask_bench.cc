// The engine thread's cost of constrained output on a word vocabulary of the
// WT103 shape (GenerateJob's TokenMasker::Next, then the model's constrained
// pick), per step of --sessions generations, each held to the same schema
// (response_format shares one masker through GrammarCache). The vocabulary
// is --vocab words: the corpus' distinct words, numbers and JSON's
// punctuation, then letter strings of the corpus' word lengths. Each
// session draws its next word uniformly among those the mask allows (a model
// that follows the grammar's shape), with one seed. Prints, per step of all
// the sessions: the masks (median and slowest step; the slowest walks the
// vocabulary for places not met before), and the model's constrained pick where the constraint refuses
// its first pick (ConstrainedPick: the masked row drawn again) against the whole-row draw alone. Figures:
// docs/API_GENERATION.md, "Constrained output".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer.h"
#include "server/sampling/grammar.h"
#include "server/sampling/json_schema.h"
#include "server/sampling/sampler.h"
#include "server/sampling/token_masker.h"

ABSL_FLAG(int, vocab, 267735, "words in the vocabulary (267,735: WT103's)");
ABSL_FLAG(int, sessions, 32, "generations stepped together");
ABSL_FLAG(int, steps, 60, "steps measured (each a token for every session)");
ABSL_FLAG(std::string, corpus, "data/tinyshakespeare.txt", "text whose words start the vocabulary");
ABSL_FLAG(std::string, schema, "",
          "a JSON Schema (file) the output follows; empty: arrays of arrays of strings, integers and booleans "
          "(beside json_object, any JSON object)");

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

txl::Tokenizer Vocabulary(const std::string& corpus_path, int size) {
  std::set<std::string> words = {"<eos>", "<unk>", "{", "}", "[",   "]",   "\"",  ":",  ",", "true",
                                 "false", "null",  "-", ".", "@-@", "@.@", "@,@", "'s", "(", ")"};
  std::ifstream in(corpus_path);
  std::string word;
  std::vector<int> lengths;
  while (in >> word && static_cast<int>(words.size()) < size) {
    words.insert(word);
    lengths.push_back(static_cast<int>(std::min<size_t>(word.size(), 20)));
  }
  if (lengths.empty()) lengths = {3, 5, 7};
  for (int n = 0; n < 10000 && static_cast<int>(words.size()) < size; ++n) words.insert(std::to_string(n));
  std::mt19937 rng(11);
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCM";
  while (static_cast<int>(words.size()) < size) {
    std::string w(static_cast<size_t>(lengths[rng() % lengths.size()]), 'a');
    for (char& c : w) c = letters[std::min<size_t>(rng() % letters.size(), rng() % letters.size())];
    words.insert(w);
  }
  return *txl::Tokenizer::WordFromSymbols(std::vector<std::string>(words.begin(), words.end()));
}

// Strings without property names or enums: those are written whole, and a
// word-level text has a space before each word after the first, so only a
// vocabulary holding `"name"` as one word could write one (API_GENERATION.md).
const char* kSchema = R"({"type": "array", "minItems": 1, "maxItems": 4,
  "items": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}}})";

struct Figures {
  std::vector<double> masks, masked_draw, bare_draw;
  int64_t tokens = 0, ended = 0, walks = 0, dead_ends = 0;
  int64_t sink = 0;  // the draws, so that none is optimised away
};

Figures Run(const std::shared_ptr<const txl::Grammar>& grammar, const txl::Tokenizer& words, int sessions, int steps) {
  Figures f;
  auto masker = txl::TokenMasker::Create(grammar, words);
  std::vector<txl::GrammarState> states(static_cast<size_t>(sessions), txl::GrammarState(grammar));
  std::vector<bool> after_word(static_cast<size_t>(sessions), true);  // a prompt ending in a word
  std::mt19937 rng(5);
  txl::SamplingConfig sampling;
  sampling.temperature = 1.0f;
  txl::Sampler sampler(sampling, 7);
  std::vector<float> row(static_cast<size_t>(words.vocab_size()), std::log(1.0f / words.vocab_size()));
  for (int step = 0; step < steps; ++step) {
    double mask_ms = 0, masked_ms = 0, bare_ms = 0;
    for (int s = 0; s < sessions; ++s) {
      auto& state = states[static_cast<size_t>(s)];
      if (!state.CanContinue() || state.Complete()) {  // a whole text: the next generation starts
        state = txl::GrammarState(grammar);
        after_word[static_cast<size_t>(s)] = true;
        ++f.ended;
      }
      const auto t0 = Clock::now();
      std::shared_ptr<const txl::TokenMask> mask = masker->Next(state, after_word[static_cast<size_t>(s)]);
      const auto t1 = Clock::now();
      // The model's constrained pick where the constraint refuses its first
      // pick (token -1 here): the masked row, drawn again; against the
      // whole-row draw alone.
      txl::SamplingPlan plan;
      plan.pick = txl::SamplingPlan::Pick::kDraw;
      plan.allowed = std::shared_ptr<const txl::AllowedTokens>(mask, &mask->bits);
      plan.fallback_uniform = sampler.NextUniform();
      f.sink += txl::ConstrainedPick(row.data(), static_cast<int64_t>(row.size()), plan, -1);
      const auto t2 = Clock::now();
      f.sink += txl::DrawInIdOrder(row.data(), static_cast<int64_t>(row.size()), 1.0f, sampler.NextUniform());
      const auto t3 = Clock::now();
      mask_ms += Ms(t1 - t0);
      masked_ms += Ms(t2 - t1);
      bare_ms += Ms(t3 - t2);
      if (mask->count == 0) {  // no word continues the text here (GenerateJob ends it FAILED_PRECONDITION)
        ++f.dead_ends;
        state = txl::GrammarState(grammar);
        after_word[static_cast<size_t>(s)] = true;
        continue;
      }
      // The model's draw: uniform among the allowed words.
      int pick = static_cast<int>(rng() % static_cast<uint64_t>(std::max<int64_t>(mask->count, 1)));
      int id = 0;
      while (id < words.vocab_size() && (!mask->bits.contains(id) || pick-- > 0)) ++id;
      bool aw = after_word[static_cast<size_t>(s)];
      state.Advance(*words.AppendedText(id, &aw));
      after_word[static_cast<size_t>(s)] = aw;
      ++f.tokens;
    }
    f.masks.push_back(mask_ms);
    f.masked_draw.push_back(masked_ms);
    f.bare_draw.push_back(bare_ms);
  }
  f.walks = masker->stats().walks;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int sessions = absl::GetFlag(FLAGS_sessions), steps = absl::GetFlag(FLAGS_steps);
  if (sessions < 1 || steps < 4 || absl::GetFlag(FLAGS_vocab) < 100) {
    std::cerr << "grammar_mask_bench: --sessions >= 1, --steps >= 4, --vocab >= 100\n";
    return 1;
  }
  const auto t0 = Clock::now();
  const txl::Tokenizer words = Vocabulary(absl::GetFlag(FLAGS_corpus), absl::GetFlag(FLAGS_vocab));
  std::cout << absl::StrFormat("vocabulary: %d words (built in %.0f ms)\n", words.vocab_size(), Ms(Clock::now() - t0));
  std::string schema = kSchema;
  if (!absl::GetFlag(FLAGS_schema).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_schema));
    std::stringstream text;
    text << in.rdbuf();
    schema = text.str();
  }
  absl::StatusOr<std::string> schema_grammar = txl::JsonSchemaGrammar(schema);
  if (!schema_grammar.ok()) {
    std::cerr << "grammar_mask_bench: " << schema_grammar.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("%-12s %14s %14s %9s %18s %18s %8s %7s %9s\n", "format", "masks, median",
                               "masks, slowest", "walks", "refused pick", "whole-row draw", "tokens", "texts",
                               "dead ends");
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"json_object", txl::JsonObjectGrammar()},
                                   std::pair<std::string, std::string>{"json_schema", *schema_grammar}}) {
    // As RequestValidator writes it for a word-level model: a blank may come first.
    auto grammar = txl::Grammar::Parse(absl::StrCat("root ::= \" \"? ", text.substr(9)));
    if (!grammar.ok()) {
      std::cerr << "grammar_mask_bench: " << grammar.status() << "\n";
      return 1;
    }
    const Figures f = Run(*grammar, words, sessions, steps);
    std::cout << absl::StrFormat("%-12s %11.2f ms %11.2f ms %9d %15.2f ms %15.2f ms %8d %7d %9d\n", name,
                                 Median(f.masks), *std::max_element(f.masks.begin(), f.masks.end()), f.walks,
                                 Median(f.masked_draw), Median(f.bare_draw), f.tokens, f.ended, f.dead_ends);
  }
  std::cout << "(medians over the steps, each step all " << sessions
            << " sessions, a fresh masker each format; walks: masks computed, the rest were kept ones)\n";
  return 0;
}
