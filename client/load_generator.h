// Load generator behind `txl-client bench`: N sessions run at once, one thread
// each. A session is created through TxlClient, then runs up to T Generate
// turns (I random token ids in, G tokens out), then is deleted. Generation is
// greedy with no stop tokens or sequences, so a completed turn yields exactly
// G tokens (the server finishes with FINISH_REASON_LENGTH).
//
// The input ids are uniform below the model's vocabulary (GetModelInfo),
// drawn from a generator seeded with the session's index: runs repeat.
//
// Time: all sessions are created first; the Generate phase starts when every
// creation has answered, and `duration` counts from then. A Generate call
// gets the deadline min(now + call_timeout, phase start + duration); a call
// cut by the run's end is counted in `requests_cut`, not as an error, and its
// session stops. Creation and deletion are bounded by call_timeout (a delete
// answered ABORTED, the session still busy with a cut call, is retried for
// up to call_timeout).
//
// Threading: RunLoad blocks its caller until the run is over. The session
// threads it starts keep their own samples, merged after they have joined.
#ifndef TXL_CLIENT_LOAD_GENERATOR_H_
#define TXL_CLIENT_LOAD_GENERATOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/txl_client.h"

namespace txl {

struct LoadGeneratorConfig {
  static constexpr int kMaxSessions = 1024;  // one thread each

  std::string server = "127.0.0.1:50051";
  int sessions = 1;       // [1, kMaxSessions]
  int64_t turns = 1;      // Generate calls per session, >= 1
  int input_tokens = 16;  // token ids fed per turn, >= 1
  int new_tokens = 16;    // tokens generated per turn, >= 1 (the server has its own maximum)
  absl::Duration duration = absl::InfiniteDuration();  // of the Generate phase, (0, 1 year] or infinite
  absl::Duration call_timeout = absl::Seconds(300);    // per call, (0, 1 year]
  // Token and TLS for a server with --auth_tokens / --tls_cert (the fields
  // above decide the address and the timeout; its own are ignored).
  ClientOptions security;
};

// INVALID_ARGUMENT naming the config field when a value is out of range.
absl::Status ValidateLoadGeneratorConfig(const LoadGeneratorConfig& config);

// Nearest-rank percentile (p in (0, 100]) of samples; 0 when there are none.
double NearestRankPercentile(std::vector<double> samples, double p);

struct LatencySummary {
  int64_t count = 0;  // samples; the percentiles are 0 when there are none
  double p50_ms = 0;
  double p95_ms = 0;
  double p99_ms = 0;
};
LatencySummary SummarizeLatencies(const std::vector<double>& samples_ms);

struct LoadReport {
  LoadGeneratorConfig config;
  int64_t sessions_created = 0;
  int64_t requests = 0;          // Generate calls started
  int64_t requests_ok = 0;       // ... that finished OK
  int64_t requests_cut = 0;      // ... ended by the run's end (duration); not errors
  int64_t generated_tokens = 0;  // tokens received, cut calls included
  int64_t fed_tokens = 0;        // input tokens of calls that got at least one token back
  double wall_seconds = 0;       // Generate phase: start to the last call's end
  double generated_tokens_per_second = 0;
  double fed_tokens_per_second = 0;
  // Client-side: call start to the first token; then the gap before each
  // later token (a response of k tokens gives k samples of gap / k).
  LatencySummary time_to_first_token;
  LatencySummary inter_token;
  bool stopped_by_duration = false;  // some session had turns left at the end
  // Failed calls of any kind (CreateSession, Generate, DeleteSession) by
  // gRPC status code name, with the first message seen for each code.
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> error_examples;

  int64_t errors_total() const;
};

// Runs the load against config.server. An error only when the run cannot
// start (bad config, GetModelInfo fails); failed calls during the run are
// counted in the report.
absl::StatusOr<LoadReport> RunLoad(const LoadGeneratorConfig& config);

// A table for people.
std::string FormatLoadReportText(const LoadReport& report);
// One JSON object; keys are listed in docs/serving.md ("Load generator: txl-client bench").
std::string FormatLoadReportJson(const LoadReport& report);

}  // namespace txl

#endif  // TXL_CLIENT_LOAD_GENERATOR_H_
