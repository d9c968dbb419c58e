// libFuzzer target: response_format's schemas (server/sampling/json_schema.h).
// Beyond "no crash, no sanitizer report", hang or runaway memory, it checks:
//   a refusal is INVALID_ARGUMENT;
//   a schema taken writes a grammar that parses (or passes one of the
//   grammar's size limits, which the service then refuses);
//   every text its grammar reads whole is JSON (a number may be beyond a
//   double: JSON's grammar does not bound exponents).
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: a schema, then (after its first NUL byte, if any) a text to read.
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "server/sampling/grammar.h"
#include "server/sampling/json_schema.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "json_schema_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string schema = input.substr(0, nul);
  const std::string text = nul == std::string::npos ? "" : input.substr(nul + 1, 512);
  auto written = txl::JsonSchemaGrammar(schema);
  if (!written.ok()) {
    Check(written.status().code() == absl::StatusCode::kInvalidArgument, "a refusal is INVALID_ARGUMENT");
    return 0;
  }
  auto g = txl::Grammar::Parse(*written);
  if (!g.ok()) {
    Check(g.status().message().find("more than") != std::string::npos, "a schema's grammar parses, within limits");
    return 0;
  }
  txl::GrammarState state(*g);
  if (state.Advance(text) && state.Complete()) {
    try {
      (void)nlohmann::json::parse(text);
    } catch (const nlohmann::json::out_of_range&) {
      // A number beyond a double ("4E4990000"): JSON's grammar has no bound on exponents.
    } catch (const nlohmann::json::exception&) {
      Check(false, "a text the grammar reads whole is JSON");
    }
  }
  return 0;
}
