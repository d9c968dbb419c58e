// libFuzzer target: the service's request checks (server/core/request_validation.h),
// which TxlService runs on every CreateSession, Generate, Converse turn and
// Score before anything else. Bytes are parsed as the txl.v1 message of the
// chosen RPC (unparsable bytes are skipped, as gRPC would refuse them), with
// or without txl-session-id metadata, against a byte, char or word tokenizer.
//
// Checked beyond "no crash, no sanitizer report":
//   - a refusal is INVALID_ARGUMENT and its message starts with a field name;
//   - what is accepted is within the limits: token ids in [0, n_token), at
//     most max_input_tokens, max_new_tokens in [1, max] (or 0 when -1 asks an
//     echo for the input's log-probs alone), sampling parameters
//     the sampler accepts, logprobs in [0, max], no empty stop sequence, stop
//     sequences and ids within their bounds,
//     mem_len in [1, max_mem_len], idle_ttl >= 0, a session id that is empty
//     or 32 lowercase hex characters (CreateSession);
//   - the session id is the metadata's when there is metadata, else the field's;
//   - text input becomes exactly the tokenizer's encoding.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: byte 0 picks the RPC (CreateSession, Generate, Score), byte 1 the
// tokenizer (byte, char, word), byte 2 the metadata (0: none, n: the next n - 1
// bytes are its value); the rest is the serialized request.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "model/tokenizer.h"
#include "server/core/request_validation.h"
#include "server/sampling/sampler.h"

namespace {

using namespace txl;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "request_validation_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
}

// Small limits, so that the fuzzer reaches every edge.
RequestLimits Limits(const Tokenizer& t) {
  RequestLimits l;
  l.n_token = t.vocab_size();
  l.default_mem_len = 8;
  l.max_mem_len = 64;
  l.max_new_tokens = 32;
  l.max_input_tokens = 24;
  l.max_top_logprobs = 5;
  l.max_n = 3;
  return l;
}

struct Setup {
  Tokenizer tokenizer;
  RequestValidator validator;
  explicit Setup(const Tokenizer& t) : tokenizer(t), validator(Limits(t), tokenizer) {}
};

const Setup& SetupFor(int which) {
  static const Setup* setups[3] = {
      new Setup(Tokenizer::Byte()),
      new Setup(*Tokenizer::CharFromCorpus("abcdefghij klmnop\nqrstuvwxyz caf\xC3\xA9 \xE4\xB8\xAD\xFF")),
      new Setup(*Tokenizer::WordFromSymbols({"the", "cat", "sat", "<eos>", "<unk>", "on", "mat"})),
  };
  return *setups[which];
}

bool StartsWithField(const absl::Status& s) {
  static const char* const kFields[] = {
      "session_id: ",
      "input.tokens.ids[",
      "input.text: ",
      "input: ",
      "max_new_tokens: ",
      "sampling.",
      "stop_token_ids[",
      "stop_sequences[",
      "logprobs: ",
      "mem_len: ",
      "idle_ttl_seconds: ",
      "stop_token_ids: ",
      "stop_sequences: ",
      "n: ",
      "best_of: ",
      "grammar: ",
      "response_format: ",
      "response_format.json_schema: ",
      "response_format.type: ",
  };
  const std::string m(s.message());
  for (const char* f : kFields)
    if (m.rfind(f, 0) == 0) return true;
  return false;
}

void CheckRefusal(const absl::Status& s) {
  Check(s.code() == absl::StatusCode::kInvalidArgument, "a refusal is INVALID_ARGUMENT");
  Check(StartsWithField(s), "a refusal names the field first");
}

void CheckSessionId(const std::string& got, const std::string& field, const std::string* md) {
  Check(got == (md ? *md : field), "the session id is the metadata's, else the field's");
  if (md && !field.empty()) Check(field == *md, "a field and metadata that differ are refused");
}

void CheckInput(const Setup& setup, const v1::Input& in, const std::vector<int>& ids) {
  const RequestLimits& l = setup.validator.limits();
  Check(static_cast<int64_t>(ids.size()) <= l.max_input_tokens, "input within max_input_tokens");
  for (int id : ids) Check(id >= 0 && id < l.n_token, "input ids in [0, n_token)");
  if (in.has_tokens()) {
    Check(std::vector<int>(in.tokens().ids().begin(), in.tokens().ids().end()) == ids, "token ids pass unchanged");
  } else if (in.has_text()) {
    absl::StatusOr<std::vector<int>> encoded = setup.tokenizer.Encode(in.text());
    Check(encoded.ok() && *encoded == ids, "text input is the tokenizer's encoding");
  } else {
    Check(ids.empty(), "no input is no tokens");
  }
}

void CheckSpec(const Setup& setup, const v1::GenerateRequest& req, const GenerateSpec& spec) {
  const RequestLimits& l = setup.validator.limits();
  CheckInput(setup, req.input(), spec.input);
  if (req.max_new_tokens() == -1) {
    // -1 with echo asks for the input's log-probs alone: nothing new, on some input.
    Check(spec.echo && spec.max_new_tokens == 0, "max_new_tokens -1 only with echo, generating nothing");
    Check(!spec.input.empty(), "echo generating nothing has input");
  } else {
    Check(spec.max_new_tokens >= 1 && spec.max_new_tokens <= l.max_new_tokens, "max_new_tokens in [1, max]");
    Check(req.max_new_tokens() == 0 || spec.max_new_tokens == req.max_new_tokens(), "max_new_tokens kept");
  }
  Check(ValidateSampling(spec.sampling).ok(), "sampling the sampler accepts");
  Check(std::isfinite(spec.sampling.temperature) && spec.sampling.temperature >= 0, "temperature finite, >= 0");
  Check(spec.sampling.top_p >= 0 && spec.sampling.top_p <= 1, "top_p in [0, 1]");
  Check(spec.sampling.top_k >= 0, "top_k >= 0");
  Check(spec.top_logprobs >= 0 && spec.top_logprobs <= l.max_top_logprobs, "logprobs in [0, max]");
  Check(static_cast<int>(spec.stop_token_ids.size()) == req.stop_token_ids_size(), "every stop token kept");
  for (int id : spec.stop_token_ids) Check(id >= 0 && id < l.n_token, "stop tokens in [0, n_token)");
  Check(static_cast<int>(spec.stop_sequences.size()) == req.stop_sequences_size(), "every stop sequence kept");
  for (const std::string& s : spec.stop_sequences) Check(!s.empty(), "no empty stop sequence");
  Check(static_cast<int>(spec.stop_sequences.size()) <= l.max_stop_sequences, "stop sequences bounded");
  for (const std::string& s : spec.stop_sequences) {
    Check(static_cast<int>(s.size()) <= l.max_stop_sequence_bytes, "stop sequence length bounded");
  }
  Check(static_cast<int>(spec.stop_token_ids.size()) <= l.max_stop_token_ids, "stop ids bounded");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Unparsable input (e.g. invalid UTF-8 in a string field) is common here; protobuf
  // would log every one of them.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int rpc = data[0] % 3;
  const Setup& setup = SetupFor(data[1] % 3);
  const RequestValidator& v = setup.validator;
  const size_t md_size = data[2] == 0 ? 0 : std::min<size_t>(data[2] - 1, size - 3);
  const std::string md_value(reinterpret_cast<const char*>(data) + 3, md_size);
  const std::string* md = data[2] != 0 ? &md_value : nullptr;
  const std::string bytes(reinterpret_cast<const char*>(data) + 3 + md_size, size - 3 - md_size);

  if (rpc == 0) {
    v1::CreateSessionRequest req;
    if (!req.ParseFromString(bytes)) return 0;
    absl::StatusOr<NewSessionArgs> args = v.CreateSession(req, md);
    if (!args.ok()) {
      CheckRefusal(args.status());
      return 0;
    }
    CheckSessionId(args->session_id, req.session_id(), md);
    Check(args->session_id.empty() || IsSessionIdForm(args->session_id), "a new session id is empty or 32 hex");
    Check(args->mem_len >= 1 && args->mem_len <= v.limits().max_mem_len, "mem_len in [1, max_mem_len]");
    Check(req.mem_len() != 0 || args->mem_len == v.limits().default_mem_len, "mem_len 0 is the default");
    Check(args->idle_ttl >= absl::ZeroDuration(), "idle_ttl >= 0");
  } else if (rpc == 1) {
    v1::GenerateRequest req;
    if (!req.ParseFromString(bytes)) return 0;
    absl::StatusOr<GenerateArgs> args = v.Generate(req, md);
    if (!args.ok()) {
      CheckRefusal(args.status());
      return 0;
    }
    CheckSessionId(args->session_id, req.session_id(), md);
    CheckSpec(setup, req, args->spec);
    const int max_n = setup.validator.limits().max_n;
    Check(args->n >= 1 && args->n <= args->best_of && args->best_of <= max_n, "1 <= n <= best_of <= max_n");
    if (args->best_of > 1) Check(args->session_id.empty() && !args->spec.echo, "choices only stateless, no echo");
  } else {
    v1::ScoreRequest req;
    if (!req.ParseFromString(bytes)) return 0;
    absl::StatusOr<ScoreArgs> args = v.Score(req, md);
    if (!args.ok()) {
      CheckRefusal(args.status());
      return 0;
    }
    CheckSessionId(args->session_id, req.session_id(), md);
    CheckInput(setup, req.input(), args->input);
  }
  return 0;
}
