// Metrics: the server's Prometheus metrics (docs/DESIGN.md, "Metrics"), kept with
// prometheus-cpp; Scrape() renders them for /metrics, which the HTTP
// transport serves on its own port (server/http/metrics_route.h). Injected into the scheduler (as its
// observer) and the service; never a singleton. No label ever carries a
// session id.
//
// Threading: every method is thread-safe (prometheus-cpp metrics and
// families lock internally).
#ifndef TXL_SERVER_METRICS_METRICS_H_
#define TXL_SERVER_METRICS_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/model_repository.h"
#include "server/jobs/scheduler_config.h"
#include "server/metrics/service_metrics.h"
#include "server/sessions/session_table.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace txl {

struct MetricsConfig {
  std::map<std::string, std::string> info;  // labels of txl_build_info
  // The model versions and their states (ModelSource::List), read at each
  // tick; null: no txl_model_version_state.
  std::function<std::vector<VersionStatus>()> versions;
  // Sessions held out of the table, waiting for room for their version
  // (SessionJournal::waiting), read at each tick; null: always 0.
  std::function<int64_t()> waiting_sessions;
  // Bytes the session pools hold against the session memory budget
  // together (SharedSlotPools::held_bytes), read at each tick; null:
  // always 0.
  std::function<int64_t()> session_pool_bytes;
  // Limits exported as gauges.
  int64_t max_sessions = 0, max_queue = 0, session_memory_budget = 0;
};

class Metrics : public SchedulerObserver, public ServiceMetrics {
 public:
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsConfig& config, const SessionTable* table);
  ~Metrics() override;

  // ServiceMetrics.
  void OnRequest(const std::string& method, const std::string& code) override;
  void OnHttpRequest(const std::string& route, int status) override;
  // SchedulerObserver.
  void OnStep(int batch_size, int64_t tokens, double seconds) override;
  void OnQueueDepth(int64_t depth) override;
  void OnFirstToken(double seconds) override;
  void OnInterTokenGap(double seconds) override;
  void OnTokensFed(int64_t n) override;
  void OnTokensGenerated(int64_t n) override;
  void OnSessionsExpired(int n) override;
  void OnTick() override;  // refreshes the session gauges
  void OnOffload(const char* to, double seconds) override;
  void OnRestore(const char* from, double seconds) override;
  void OnRewind(const char* served, int64_t replayed, double seconds) override;
  void OnModelStep(const std::string& model, int rows, int64_t tokens) override;
  void OnModelTokenGenerated(const std::string& model) override;

  // The text exposition (what /metrics serves), for tests and debugging.
  std::string Scrape() const;

 private:
  Metrics() = default;
  // Create's parts: the families by concept, registered in this order.
  void AddRequestFamilies(prometheus::Registry& r);
  void AddStepFamilies(prometheus::Registry& r);
  void AddSessionFamilies(prometheus::Registry& r);
  void AddTierFamilies(prometheus::Registry& r);
  void AddRewindFamilies(prometheus::Registry& r, const SessionTable* table);
  void AddStateCacheFamilies(prometheus::Registry& r, const SessionTable* table);
  void TickStateCache();
  void AddModelFamilies(prometheus::Registry& r);  // model_metrics.cc
  void TickModels();
  static void AddLimitFamilies(prometheus::Registry& r, const MetricsConfig& config);

  const SessionTable* table_ = nullptr;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_requests_ = nullptr;
  prometheus::Counter *tokens_fed_ = nullptr, *tokens_generated_ = nullptr, *evicted_ttl_ = nullptr;
  prometheus::Histogram *ttft_ = nullptr, *itl_ = nullptr, *step_seconds_ = nullptr;
  prometheus::Histogram *batch_size_ = nullptr, *step_tokens_ = nullptr;
  prometheus::Gauge *queue_depth_ = nullptr, *sessions_idle_ = nullptr, *sessions_busy_ = nullptr,
                    *sessions_waiting_ = nullptr;
  prometheus::Gauge *memory_bytes_ = nullptr, *reserved_bytes_ = nullptr, *pool_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* offloads_ = nullptr;
  prometheus::Family<prometheus::Counter>* restores_ = nullptr;
  prometheus::Family<prometheus::Histogram>* offload_seconds_ = nullptr;
  prometheus::Family<prometheus::Histogram>* restore_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tier_sessions_ = nullptr;
  prometheus::Gauge* host_bytes_ = nullptr;
  // Rewinds and forks at a position (docs/SESSIONS.md, "Rewind").
  prometheus::Family<prometheus::Counter>* rewinds_ = nullptr;
  prometheus::Counter* rewind_replayed_ = nullptr;
  prometheus::Histogram* rewind_seconds_ = nullptr;
  prometheus::Gauge *checkpoint_bytes_ = nullptr, *checkpoints_ = nullptr;
  // The state cache (docs/SESSIONS.md, "The state cache"): its counters
  // follow StateCache::stats(), read at each tick.
  prometheus::Family<prometheus::Counter>* cache_lookups_ = nullptr;
  prometheus::Counter *cache_saved_ = nullptr, *cache_evictions_ = nullptr;
  prometheus::Gauge *cache_bytes_ = nullptr, *cache_entries_ = nullptr;
  absl::Mutex cache_mu_;
  StateCacheStats cache_seen_ ABSL_GUARDED_BY(cache_mu_);
  // Per model version (model_metrics.cc); labels come from the repository, never from clients.
  std::function<std::vector<VersionStatus>()> versions_;
  std::function<int64_t()> waiting_sessions_;
  std::function<int64_t()> session_pool_bytes_;
  prometheus::Family<prometheus::Counter>*model_steps_ = nullptr, *model_fed_ = nullptr, *model_generated_ = nullptr;
  prometheus::Family<prometheus::Gauge>*model_sessions_ = nullptr, *model_state_ = nullptr;
  absl::Mutex model_mu_;
  std::set<std::string> models_seen_ ABSL_GUARDED_BY(model_mu_);  // their session gauges drop to 0
};

}  // namespace txl

#endif  // TXL_SERVER_METRICS_METRICS_H_
