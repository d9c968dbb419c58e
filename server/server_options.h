// ServerOptions: every txl-server flag, as the config structs of the parts
// it sets. main.cc fills it (OptionsFromFlags, the one place flags are
// read); Serve (serve.h) builds the server from it.
#ifndef TXL_SERVER_SERVER_OPTIONS_H_
#define TXL_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "model/net/language_model.h"
#include "server/core/service_config.h"
#include "server/durability/session_journal.h"
#include "server/durability/state_backend.h"
#include "server/engine/model_repository.h"
#include "server/http/chat_template.h"
#include "server/http/http_server.h"
#include "server/jobs/scheduler_config.h"
#include "server/metrics/metrics.h"
#include "server/sessions/session_table.h"

namespace txl {

struct ServerOptions {
  LanguageModelOptions model;  // with --model_repository, every version's options but the path
  // --model_repository (dir empty: --model alone), --version_policy, --model_memory_budget.
  ModelRepositoryConfig repository;
  // --model_memory_budget as given: -1 sets the repository's budget once the
  // start-up versions are loaded (serve.cc's DefaultModelBudget).
  int64_t model_memory_budget = -1;
  absl::Duration repository_poll = absl::InfiniteDuration();  // --repository_poll_seconds (0: never)
  int repository_load_nice = 19;                              // --repository_load_nice
  ServiceConfig service;                                      // default_mem_len 0: the model's, once it is loaded
  SessionTableConfig table;
  SchedulerConfig scheduler;
  MetricsConfig metrics;
  bool state_store = false;  // with backend and journal:
  StateBackendConfig backend;
  SessionJournalConfig journal;
  HttpServerConfig http;       // listen empty: no HTTP port
  std::string metrics_listen;  // empty: no /metrics
  ChatTemplate chat_template;
  // The gRPC port.
  std::string listen, auth_tokens, tls_cert, tls_key, tls_client_ca;
  int max_message_bytes = 0;
  int64_t grpc_memory_quota = 0;
  int64_t gpu_headroom = 0;   // 0: 10% of the device, at least 1 GiB
  int64_t host_headroom = 0;  // 0: 10% of the host
  int grpc_max_threads = 0;
  absl::Duration max_connection_idle, drain_timeout;
};

}  // namespace txl

#endif  // TXL_SERVER_SERVER_OPTIONS_H_
