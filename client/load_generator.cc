#include "client/load_generator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "client/txl_client.h"
#include "nlohmann/json.hpp"
#include "proto/txl/v1/txl.grpc.pb.h"

namespace txl {
namespace {

using Clock = std::chrono::steady_clock;

// The longest duration or call timeout: far from overflowing a time point.
constexpr absl::Duration kMaxSpan = absl::Hours(24 * 365);

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Holds session threads until all of them have tried to create their
// session, so the Generate phase starts together (and a session limit is hit
// before any session is deleted). Thread-safe.
class StartGate {
 public:
  explicit StartGate(int parties) : waiting_(parties) {}
  // Blocks until every party has arrived or left; returns when the last did.
  Clock::time_point ArriveAndWait() {
    absl::MutexLock lock(&mu_);
    Leave(1);
    mu_.Await(absl::Condition(this, &StartGate::Open));
    return start_;
  }
  // For parties that will never arrive (their thread did not start).
  void LeaveWithoutWaiting(int parties) {
    absl::MutexLock lock(&mu_);
    Leave(parties);
  }

 private:
  void Leave(int parties) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waiting_ -= parties;
    if (waiting_ <= 0) start_ = Clock::now();
  }
  bool Open() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ <= 0; }

  absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_);
  Clock::time_point start_ ABSL_GUARDED_BY(mu_);
};

// What one session thread saw; owned by that thread until it is joined.
struct SessionResult {
  bool created = false;
  bool stopped_early = false;  // the run's end came before its last turn did
  Clock::time_point start;     // of the Generate phase
  Clock::time_point end;       // its last Generate call's end (start when none)
  int64_t requests = 0, ok = 0, cut = 0, generated = 0, fed = 0;
  std::vector<double> ttft_ms, itl_ms;
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> examples;

  void Fail(const char* call, const absl::Status& s) {
    const std::string code = absl::StatusCodeToString(s.code());
    if (errors[code]++ == 0) examples[code] = absl::StrCat(call, ": ", s.message());
  }
};

// Read-only during the run; the client and stub are thread-safe.
struct Run {
  const LoadGeneratorConfig& config;
  TxlClient& client;
  v1::TransformerXL::Stub& stub;
  int64_t vocab;
  StartGate& gate;
};

void DeleteSession(const Run& run, const std::string& id, SessionResult* out) {
  // ABORTED: the session is still busy with a call the run's end cut; the
  // server lets it go at its next engine step.
  const Clock::time_point give_up = Clock::now() + absl::ToChronoNanoseconds(run.config.call_timeout);
  absl::Duration backoff = absl::Milliseconds(5);
  for (;;) {
    const absl::Status s = run.client.DeleteSession(id);
    if (s.ok()) return;
    if (s.code() != absl::StatusCode::kAborted || Clock::now() + absl::ToChronoNanoseconds(backoff) >= give_up) {
      out->Fail("DeleteSession", s);
      return;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

void RunSession(const Run& run, int index, SessionResult* out) {
  const LoadGeneratorConfig& config = run.config;
  absl::StatusOr<v1::Session> session = run.client.CreateSession(v1::CreateSessionRequest());
  if (!session.ok()) out->Fail("CreateSession", session.status());
  out->start = out->end = run.gate.ArriveAndWait();
  if (!session.ok()) return;
  out->created = true;
  const std::string& id = session->session_id();

  const bool bounded = config.duration != absl::InfiniteDuration();
  const Clock::time_point run_end =
      bounded ? out->start + absl::ToChronoNanoseconds(config.duration) : Clock::time_point::max();
  const auto call_timeout = absl::ToChronoNanoseconds(config.call_timeout);
  std::mt19937_64 rng(static_cast<uint64_t>(index) + 1);
  std::uniform_int_distribution<int64_t> pick(0, run.vocab - 1);

  v1::GenerateRequest req;
  req.set_session_id(id);
  req.set_max_new_tokens(config.new_tokens);
  req.mutable_sampling()->set_temperature(0);  // greedy; no stop tokens: exactly new_tokens
  auto* ids = req.mutable_input()->mutable_tokens()->mutable_ids();
  for (int64_t turn = 0; turn < config.turns; ++turn) {
    const Clock::time_point now = Clock::now();
    if (now >= run_end) {
      out->stopped_early = true;
      break;
    }
    ids->Clear();
    for (int i = 0; i < config.input_tokens; ++i) ids->Add(static_cast<int32_t>(pick(rng)));
    const bool ends_at_run_end = bounded && run_end - now <= call_timeout;
    const Clock::time_point deadline = ends_at_run_end ? run_end : now + call_timeout;

    grpc::ClientContext ctx;
    run.client.Prepare(&ctx, id);  // the session id and the token
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - now));
    ++out->requests;
    const Clock::time_point sent = Clock::now();
    Clock::time_point last = sent;
    int64_t got = 0;
    auto reader = run.stub.Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      const int k = r.tokens_size();
      if (k == 0) continue;
      const Clock::time_point t = Clock::now();
      if (got == 0) {
        out->ttft_ms.push_back(Ms(t - sent));
      } else {
        out->itl_ms.insert(out->itl_ms.end(), k, Ms(t - last) / k);
      }
      last = t;
      got += k;
    }
    const grpc::Status status = reader->Finish();
    out->end = Clock::now();
    out->generated += got;
    if (got > 0) out->fed += config.input_tokens;  // the input is fed before the first token
    if (status.ok()) {
      ++out->ok;
    } else if (ends_at_run_end && status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ++out->cut;
      out->stopped_early = true;
      break;
    } else {
      out->Fail("Generate", TxlClient::FromGrpc(status));
    }
  }
  DeleteSession(run, id, out);
}

}  // namespace

absl::Status ValidateLoadGeneratorConfig(const LoadGeneratorConfig& c) {
  if (c.server.empty()) return absl::InvalidArgumentError("server: address required");
  if (c.sessions < 1 || c.sessions > LoadGeneratorConfig::kMaxSessions) {
    return absl::InvalidArgumentError(
        absl::StrCat("sessions: must be in [1, ", LoadGeneratorConfig::kMaxSessions, "], got ", c.sessions));
  }
  if (c.turns < 1) return absl::InvalidArgumentError(absl::StrCat("turns: must be >= 1, got ", c.turns));
  if (c.input_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("input_tokens: must be >= 1, got ", c.input_tokens));
  }
  if (c.new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("new_tokens: must be >= 1, got ", c.new_tokens));
  }
  const auto in_range = [](absl::Duration d) { return d > absl::ZeroDuration() && d <= kMaxSpan; };
  if (c.duration != absl::InfiniteDuration() && !in_range(c.duration)) {
    return absl::InvalidArgumentError(absl::StrCat("duration: must be in (0, ", absl::FormatDuration(kMaxSpan),
                                                   "] or infinite, got ", absl::FormatDuration(c.duration)));
  }
  if (!in_range(c.call_timeout)) {
    return absl::InvalidArgumentError(absl::StrCat("call_timeout: must be in (0, ", absl::FormatDuration(kMaxSpan),
                                                   "], got ", absl::FormatDuration(c.call_timeout)));
  }
  return absl::OkStatus();
}

double NearestRankPercentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double n = static_cast<double>(samples.size());
  const auto rank = static_cast<size_t>(std::clamp(std::ceil(p / 100.0 * n), 1.0, n));
  return samples[rank - 1];
}

LatencySummary SummarizeLatencies(const std::vector<double>& samples_ms) {
  LatencySummary s;
  s.count = static_cast<int64_t>(samples_ms.size());
  s.p50_ms = NearestRankPercentile(samples_ms, 50);
  s.p95_ms = NearestRankPercentile(samples_ms, 95);
  s.p99_ms = NearestRankPercentile(samples_ms, 99);
  return s;
}

int64_t LoadReport::errors_total() const {
  int64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

absl::StatusOr<LoadReport> RunLoad(const LoadGeneratorConfig& config) {
  RETURN_IF_ERROR(ValidateLoadGeneratorConfig(config));
  ClientOptions options = config.security;
  options.server = config.server;
  options.timeout = config.call_timeout;
  ASSIGN_OR_RETURN(const std::unique_ptr<TxlClient> client, TxlClient::Create(options));
  absl::StatusOr<v1::ModelInfo> info = client->Info();
  if (!info.ok()) return WithContext("GetModelInfo", info.status());
  int64_t vocab = info->vocab_size();
  if (info->n_token() > 0 && (vocab <= 0 || info->n_token() < vocab)) vocab = info->n_token();
  if (vocab <= 0) return absl::FailedPreconditionError("GetModelInfo: the model reports no vocabulary");

  // Generate goes through a stub of its own: each call's deadline may be the run's end.
  // (Its channel, so TLS and the token apply to it too.)
  auto stub = v1::TransformerXL::NewStub(client->channel());
  StartGate gate(config.sessions);
  const Run run{config, *client, *stub, vocab, gate};
  std::vector<SessionResult> results(config.sessions);
  std::vector<std::thread> threads;
  threads.reserve(config.sessions);
  absl::Status started;
  for (int i = 0; i < config.sessions; ++i) {
    try {
      threads.emplace_back(RunSession, std::cref(run), i, &results[i]);
    } catch (const std::system_error& e) {
      gate.LeaveWithoutWaiting(config.sessions - i);
      started = absl::ResourceExhaustedError(absl::StrCat("cannot start session thread ", i, ": ", e.what()));
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  if (!started.ok()) return started;

  LoadReport report;
  report.config = config;
  std::vector<double> ttft, itl;
  Clock::time_point end = results.front().start;
  for (SessionResult& r : results) {
    report.sessions_created += r.created ? 1 : 0;
    report.requests += r.requests;
    report.requests_ok += r.ok;
    report.requests_cut += r.cut;
    report.generated_tokens += r.generated;
    report.fed_tokens += r.fed;
    report.stopped_by_duration = report.stopped_by_duration || r.stopped_early;
    ttft.insert(ttft.end(), r.ttft_ms.begin(), r.ttft_ms.end());
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    for (const auto& [code, n] : r.errors) report.errors[code] += n;
    for (const auto& [code, message] : r.examples) report.error_examples.emplace(code, message);
    end = std::max(end, r.end);
  }
  report.wall_seconds = std::chrono::duration<double>(end - results.front().start).count();
  if (report.wall_seconds > 0) {
    report.generated_tokens_per_second = static_cast<double>(report.generated_tokens) / report.wall_seconds;
    report.fed_tokens_per_second = static_cast<double>(report.fed_tokens) / report.wall_seconds;
  }
  report.time_to_first_token = SummarizeLatencies(ttft);
  report.inter_token = SummarizeLatencies(itl);
  return report;
}

std::string FormatLoadReportText(const LoadReport& r) {
  const LoadGeneratorConfig& c = r.config;
  std::string out = absl::StrFormat(
      "txl-client bench: %s, %d sessions x %d turns, %d input + %d generated tokens per turn%s\n", c.server, c.sessions,
      c.turns, c.input_tokens, c.new_tokens,
      c.duration == absl::InfiniteDuration() ? "" : absl::StrCat(", at most ", absl::FormatDuration(c.duration)));
  absl::StrAppendFormat(&out, "sessions      %d of %d created\n", r.sessions_created, c.sessions);
  absl::StrAppendFormat(&out, "wall time     %.3f s (%s)\n", r.wall_seconds,
                        r.stopped_by_duration ? "stopped by the duration" : "all turns done");
  absl::StrAppendFormat(&out, "requests      %d (ok %d, cut by the duration %d, failed %d)\n", r.requests,
                        r.requests_ok, r.requests_cut, r.requests - r.requests_ok - r.requests_cut);
  absl::StrAppendFormat(&out, "generated     %d tokens, %.1f tokens/s\n", r.generated_tokens,
                        r.generated_tokens_per_second);
  absl::StrAppendFormat(&out, "fed           %d tokens, %.1f tokens/s\n", r.fed_tokens, r.fed_tokens_per_second);
  absl::StrAppendFormat(&out, "%-22s %8s %10s %10s %10s\n", "latency (ms)", "count", "p50", "p95", "p99");
  for (const auto& [name, l] :
       {std::pair<const char*, const LatencySummary&>{"time to first token", r.time_to_first_token},
        {"inter-token", r.inter_token}}) {
    absl::StrAppendFormat(&out, "%-22s %8d %10.2f %10.2f %10.2f\n", name, l.count, l.p50_ms, l.p95_ms, l.p99_ms);
  }
  if (r.errors.empty()) {
    out += "errors        none\n";
  } else {
    absl::StrAppendFormat(&out, "errors        %d\n", r.errors_total());
    for (const auto& [code, n] : r.errors) {
      absl::StrAppendFormat(&out, "  %-20s %6d  e.g. %s\n", code, n, r.error_examples.at(code));
    }
  }
  return out;
}

std::string FormatLoadReportJson(const LoadReport& r) {
  const auto latency = [](const LatencySummary& l) {
    nlohmann::ordered_json j;
    j["count"] = l.count;
    for (const auto& [key, value] :
         {std::pair<const char*, double>{"p50", l.p50_ms}, {"p95", l.p95_ms}, {"p99", l.p99_ms}}) {
      j[key] = l.count > 0 ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
    }
    return j;
  };
  const LoadGeneratorConfig& c = r.config;
  nlohmann::ordered_json j;
  j["server"] = c.server;
  j["sessions"] = c.sessions;
  j["turns"] = c.turns;
  j["input_tokens"] = c.input_tokens;
  j["new_tokens"] = c.new_tokens;
  j["duration_seconds"] = c.duration == absl::InfiniteDuration()
                              ? nlohmann::ordered_json(nullptr)
                              : nlohmann::ordered_json(absl::ToDoubleSeconds(c.duration));
  j["sessions_created"] = r.sessions_created;
  j["requests"] = r.requests;
  j["requests_ok"] = r.requests_ok;
  j["requests_cut"] = r.requests_cut;
  j["generated_tokens"] = r.generated_tokens;
  j["fed_tokens"] = r.fed_tokens;
  j["wall_seconds"] = r.wall_seconds;
  j["generated_tokens_per_second"] = r.generated_tokens_per_second;
  j["fed_tokens_per_second"] = r.fed_tokens_per_second;
  j["time_to_first_token_ms"] = latency(r.time_to_first_token);
  j["inter_token_ms"] = latency(r.inter_token);
  j["stopped_by"] = r.stopped_by_duration ? "duration" : "turns";
  j["errors_total"] = r.errors_total();
  j["errors"] = nlohmann::ordered_json::object();
  for (const auto& [code, n] : r.errors) j["errors"][code] = n;
  j["error_examples"] = nlohmann::ordered_json::object();
  for (const auto& [code, message] : r.error_examples) j["error_examples"][code] = message;
  return j.dump(2) + "\n";
}

}  // namespace txl
