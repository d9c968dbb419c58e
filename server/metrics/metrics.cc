#include "server/metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace txl {
namespace {

prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// Offload and restore times: 0.1 ms .. 13 s.
prometheus::Histogram::BucketBoundaries MoveBuckets() { return Exponential(0.0001, 2, 18); }

// Request and step times: 1 ms .. 33 s.
prometheus::Histogram::BucketBoundaries Latency() { return Exponential(0.001, 2, 16); }

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsConfig& config, const SessionTable* table) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->table_ = table;
  m->registry_ = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry_;
  // The exposition lists families by kind (counters, gauges, histograms),
  // each kind in the order registered here.
  m->AddRequestFamilies(r);
  m->AddStepFamilies(r);
  m->AddSessionFamilies(r);
  m->AddTierFamilies(r);
  m->AddRewindFamilies(r, table);
  m->AddStateCacheFamilies(r, table);
  m->AddModelFamilies(r);
  m->versions_ = config.versions;
  m->waiting_sessions_ = config.waiting_sessions;
  m->session_pool_bytes_ = config.session_pool_bytes;
  m->TickModels();  // the versions' states from the start
  AddLimitFamilies(r, config);
  return m;
}

// Requests and tokens: RPCs, HTTP requests, tokens fed and generated,
// sessions evicted; time to first token and between tokens.
void Metrics::AddRequestFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildHistogram;
  requests_ = &BuildCounter().Name("txl_requests_total").Help("RPCs by method and status code").Register(r);
  http_requests_ =
      &BuildCounter().Name("txl_http_requests_total").Help("HTTP requests by route and status").Register(r);
  tokens_fed_ = &BuildCounter().Name("txl_tokens_fed_total").Help("Tokens fed through the model").Register(r).Add({});
  tokens_generated_ = &BuildCounter().Name("txl_tokens_generated_total").Help("Tokens generated").Register(r).Add({});
  evicted_ttl_ = &BuildCounter()
                      .Name("txl_session_evictions_total")
                      .Help("Sessions removed by the server, by reason")
                      .Register(r)
                      .Add({{"reason", "idle_ttl"}});
  ttft_ = &BuildHistogram()
               .Name("txl_time_to_first_token_seconds")
               .Help("Request start to first token")
               .Register(r)
               .Add({}, Latency());
  itl_ = &BuildHistogram()
              .Name("txl_inter_token_seconds")
              .Help("Gap between a request's tokens")
              .Register(r)
              .Add({}, Latency());
}

// Engine steps: their time, requests and tokens per step, the queue.
void Metrics::AddStepFamilies(prometheus::Registry& r) {
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  step_seconds_ =
      &BuildHistogram().Name("txl_engine_step_seconds").Help("One batched forward pass").Register(r).Add({}, Latency());
  batch_size_ = &BuildHistogram()
                     .Name("txl_batch_size")
                     .Help("Requests per engine step")
                     .Register(r)
                     .Add({}, Exponential(1, 2, 9));
  step_tokens_ = &BuildHistogram()
                      .Name("txl_step_tokens")
                      .Help("Tokens fed per engine step")
                      .Register(r)
                      .Add({}, Exponential(1, 2, 14));
  queue_depth_ = &BuildGauge().Name("txl_queue_depth").Help("Requests waiting for the engine").Register(r).Add({});
}

// Sessions: by state, and the bytes of their memories.
void Metrics::AddSessionFamilies(prometheus::Registry& r) {
  using prometheus::BuildGauge;
  auto& sessions = BuildGauge().Name("txl_sessions").Help("Sessions by state").Register(r);
  sessions_idle_ = &sessions.Add({{"state", "idle"}});
  sessions_busy_ = &sessions.Add({{"state", "busy"}});
  // Not a state of txl_sessions: they are out of the table, so not counted against --max_sessions.
  sessions_waiting_ = &BuildGauge()
                           .Name("txl_sessions_waiting")
                           .Help(
                               "Sessions held in the state store, waiting for room for their version under "
                               "--model_memory_budget")
                           .Register(r)
                           .Add({});
  memory_bytes_ =
      &BuildGauge().Name("txl_session_memory_bytes").Help("Bytes of all session memories").Register(r).Add({});
  reserved_bytes_ = &BuildGauge()
                         .Name("txl_session_memory_reserved_bytes")
                         .Help("Full-window bytes of all sessions (what the memory budget counts)")
                         .Register(r)
                         .Add({});
  pool_bytes_ =
      &BuildGauge()
           .Name("txl_session_pool_bytes")
           .Help(
               "Bytes the session pools of a repository's architectures hold together against the "
               "session memory budget (with --model_repository and a budget, on the generic kernels and GPUs; 0 "
               "otherwise)")
           .Register(r)
           .Add({});
}

// Offload (--host_memory_budget) and the state store: where sessions are, how they move.
void Metrics::AddTierFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  offloads_ = &BuildCounter()
                   .Name("txl_session_offloads_total")
                   .Help("Idle sessions moved out of device memory (to=host) or host memory (to=store)")
                   .Register(r);
  restores_ = &BuildCounter()
                   .Name("txl_session_restores_total")
                   .Help("Sessions brought back into device memory, from=host or from=store")
                   .Register(r);
  offload_seconds_ =
      &BuildHistogram().Name("txl_session_offload_seconds").Help("Time to offload one session").Register(r);
  restore_seconds_ = &BuildHistogram()
                          .Name("txl_session_restore_seconds")
                          .Help("Time to bring one session back (read, rebuild, replay)")
                          .Register(r);
  tier_sessions_ = &BuildGauge()
                        .Name("txl_sessions_by_tier")
                        .Help("Sessions by where their state is: device, host, store")
                        .Register(r);
  host_bytes_ = &BuildGauge()
                     .Name("txl_session_host_bytes")
                     .Help("Bytes of offloaded sessions held in host memory")
                     .Register(r)
                     .Add({});
  // Every series exists from the start (at 0), so dashboards and rates see them before the first offload.
  for (const char* to : {"host", "store"}) {
    offloads_->Add({{"to", to}});
    offload_seconds_->Add({{"to", to}}, MoveBuckets());
    restores_->Add({{"from", to}});
    restore_seconds_->Add({{"from", to}}, MoveBuckets());
  }
  for (const char* tier : {"device", "host", "store"}) tier_sessions_->Add({{"tier", tier}});
}

// Rewinds and forks at a position, and the turn checkpoints that serve them
// (the budget only with a session table).
void Metrics::AddRewindFamilies(prometheus::Registry& r, const SessionTable* table) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  rewinds_ = &BuildCounter()
                  .Name("txl_rewinds_total")
                  .Help(
                      "Rewinds and forks at a position, by how they were served: checkpoint (an image, "
                      "nothing replayed), replay, current (nothing to rebuild)")
                  .Register(r);
  for (const char* served : {"checkpoint", "replay", "current"}) rewinds_->Add({{"served", served}});
  rewind_replayed_ = &BuildCounter()
                          .Name("txl_rewind_replayed_tokens_total")
                          .Help("History tokens fed again to rebuild a rewound or forked state")
                          .Register(r)
                          .Add({});
  rewind_seconds_ = &BuildHistogram()
                         .Name("txl_rewind_seconds")
                         .Help("Time to rebuild a session's state at an earlier position")
                         .Register(r)
                         .Add({}, MoveBuckets());
  checkpoint_bytes_ = &BuildGauge()
                           .Name("txl_checkpoint_bytes")
                           .Help("Bytes of turn checkpoints held (checkpoint_budget)")
                           .Register(r)
                           .Add({});
  checkpoints_ = &BuildGauge().Name("txl_checkpoints").Help("Turn checkpoints held, all sessions").Register(r).Add({});
  if (table != nullptr) {
    BuildGauge()
        .Name("txl_checkpoint_budget_bytes")
        .Help("Turn checkpoint budget in bytes (checkpoint_budget; 0: none)")
        .Register(r)
        .Add({})
        .Set(static_cast<double>(table->config().checkpoints.budget_bytes));
  }
}

// The state cache: lookups by result, tokens hits did not feed, evictions,
// what it holds, and its budget (only with a session table).
void Metrics::AddStateCacheFamilies(prometheus::Registry& r, const SessionTable* table) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  cache_lookups_ = &BuildCounter()
                        .Name("txl_state_cache_lookups_total")
                        .Help(
                            "State cache lookups of requests without a session, by result: hit, store_hit (kept "
                            "in the state store by a replica), miss")
                        .Register(r);
  for (const char* result : {"hit", "store_hit", "miss"}) cache_lookups_->Add({{"result", result}});
  cache_saved_ = &BuildCounter()
                      .Name("txl_state_cache_saved_tokens_total")
                      .Help("Input tokens that state cache hits did not feed (beyond what bounded replay skips)")
                      .Register(r)
                      .Add({});
  cache_evictions_ = &BuildCounter()
                          .Name("txl_state_cache_evictions_total")
                          .Help("State cache entries evicted for the budget (least recently used first)")
                          .Register(r)
                          .Add({});
  cache_bytes_ = &BuildGauge()
                      .Name("txl_state_cache_bytes")
                      .Help("Bytes the state cache holds (state_cache_budget)")
                      .Register(r)
                      .Add({});
  cache_entries_ = &BuildGauge().Name("txl_state_cache_entries").Help("States the cache holds").Register(r).Add({});
  if (table != nullptr) {
    BuildGauge()
        .Name("txl_state_cache_budget_bytes")
        .Help("State cache budget in bytes (state_cache_budget; 0: no cache)")
        .Register(r)
        .Add({})
        .Set(static_cast<double>(table->config().state_cache.budget_bytes));
  }
}

// Limits, so that rules can express saturation as a ratio; and the build facts.
void Metrics::AddLimitFamilies(prometheus::Registry& r, const MetricsConfig& config) {
  using prometheus::BuildGauge;
  BuildGauge()
      .Name("txl_sessions_max")
      .Help("Session limit (max_sessions)")
      .Register(r)
      .Add({})
      .Set(static_cast<double>(config.max_sessions));
  BuildGauge()
      .Name("txl_queue_max")
      .Help("Queue limit (max_queue)")
      .Register(r)
      .Add({})
      .Set(static_cast<double>(config.max_queue));
  BuildGauge()
      .Name("txl_session_memory_budget_bytes")
      .Help("Session memory budget in bytes (session_memory_budget; 0: none)")
      .Register(r)
      .Add({})
      .Set(static_cast<double>(config.session_memory_budget));
  BuildGauge()
      .Name("txl_build_info")
      .Help("Build and model facts (value 1)")
      .Register(r)
      .Add({config.info.begin(), config.info.end()})
      .Set(1);
}

Metrics::~Metrics() = default;

void Metrics::OnHttpRequest(const std::string& route, int status) {
  http_requests_->Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
}

void Metrics::OnRequest(const std::string& method, const std::string& code) {
  requests_->Add({{"method", method}, {"code", code}}).Increment();
}
void Metrics::OnStep(int batch_size, int64_t tokens, double seconds) {
  batch_size_->Observe(batch_size);
  step_tokens_->Observe(static_cast<double>(tokens));
  step_seconds_->Observe(seconds);
}
void Metrics::OnQueueDepth(int64_t depth) { queue_depth_->Set(static_cast<double>(depth)); }
void Metrics::OnFirstToken(double seconds) { ttft_->Observe(seconds); }
void Metrics::OnInterTokenGap(double seconds) { itl_->Observe(seconds); }
void Metrics::OnTokensFed(int64_t n) { tokens_fed_->Increment(static_cast<double>(n)); }
void Metrics::OnTokensGenerated(int64_t n) { tokens_generated_->Increment(static_cast<double>(n)); }
void Metrics::OnSessionsExpired(int n) { evicted_ttl_->Increment(n); }
void Metrics::OnOffload(const char* to, double seconds) {
  offloads_->Add({{"to", to}}).Increment();
  offload_seconds_->Add({{"to", to}}, MoveBuckets()).Observe(seconds);
}
void Metrics::OnRestore(const char* from, double seconds) {
  restores_->Add({{"from", from}}).Increment();
  restore_seconds_->Add({{"from", from}}, MoveBuckets()).Observe(seconds);
}
void Metrics::OnRewind(const char* served, int64_t replayed, double seconds) {
  rewinds_->Add({{"served", served}}).Increment();
  rewind_replayed_->Increment(static_cast<double>(replayed));
  rewind_seconds_->Observe(seconds);
}

void Metrics::OnTick() {
  if (table_ == nullptr) return;
  const SessionTable::TierCounts tiers = table_->tiers();
  tier_sessions_->Add({{"tier", "device"}}).Set(static_cast<double>(tiers.device));
  tier_sessions_->Add({{"tier", "host"}}).Set(static_cast<double>(tiers.host));
  tier_sessions_->Add({{"tier", "store"}}).Set(static_cast<double>(tiers.state_store));
  host_bytes_->Set(static_cast<double>(tiers.host_bytes));
  const int64_t total = table_->size(), busy = table_->busy_count();
  sessions_busy_->Set(static_cast<double>(busy));
  sessions_idle_->Set(static_cast<double>(total - busy));
  if (waiting_sessions_) sessions_waiting_->Set(static_cast<double>(waiting_sessions_()));
  if (session_pool_bytes_) pool_bytes_->Set(static_cast<double>(session_pool_bytes_()));
  memory_bytes_->Set(static_cast<double>(table_->memory_bytes()));
  reserved_bytes_->Set(static_cast<double>(table_->reserved_bytes()));
  checkpoint_bytes_->Set(static_cast<double>(table_->checkpoints().bytes()));
  checkpoints_->Set(static_cast<double>(table_->checkpoints().count()));
  TickStateCache();
  TickModels();
}

void Metrics::TickStateCache() {
  const StateCacheStats now = table_->state_cache().stats();
  absl::MutexLock lock(&cache_mu_);
  cache_lookups_->Add({{"result", "hit"}}).Increment(static_cast<double>(now.hits - cache_seen_.hits));
  cache_lookups_->Add({{"result", "store_hit"}})
      .Increment(static_cast<double>(now.store_hits - cache_seen_.store_hits));
  cache_lookups_->Add({{"result", "miss"}}).Increment(static_cast<double>(now.misses - cache_seen_.misses));
  cache_saved_->Increment(static_cast<double>(now.tokens_saved - cache_seen_.tokens_saved));
  cache_evictions_->Increment(static_cast<double>(now.evictions - cache_seen_.evictions));
  cache_bytes_->Set(static_cast<double>(now.bytes));
  cache_entries_->Set(static_cast<double>(now.entries));
  cache_seen_ = now;
}

std::string Metrics::Scrape() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

}  // namespace txl
