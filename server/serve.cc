// Wiring only: the parts of txl-server built from ServerOptions, bottom up.
#include "server/serve.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/host_memory.h"
#include "base/malloc_tuning.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "model/device_memory.h"
#include "model/net/shared_slot_pools.h"
#include "server/batching/scheduler.h"
#include "server/core/auth.h"
#include "server/core/readmit_waiting.h"
#include "server/durability/recovery.h"
#include "server/durability/session_journal.h"
#include "server/durability/shared_state_cache.h"
#include "server/durability/state_backend.h"
#include "server/engine/model_engine.h"
#include "server/engine/model_loader.h"
#include "server/engine/model_repository.h"
#include "server/engine/model_source.h"
#include "server/engine/repository_poller.h"
#include "server/engine/served_model.h"
#include "server/grpc/service.h"
#include "server/http/http_server.h"
#include "server/http/metrics_route.h"
#include "server/http/openai_gateway.h"
#include "server/metrics/metrics.h"
#include "server/sessions/device_budget.h"
#include "server/sessions/host_budget.h"
#include "server/sessions/session_table.h"

namespace txl {
namespace {

int Fail(const std::string& msg) {
  std::cerr << "txl-server: " << msg << std::endl;
  return 1;
}

// The content of the PEM file named by --`flag`, which must hold `marker`
// (e.g. "-----BEGIN CERTIFICATE-----"): gRPC's own error for a bad file only
// says that the port could not be opened.
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path, const char* marker, const char* what) {
  auto text = txl::ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", text.status().message()));
  if (text->find(marker) == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " holds no PEM ", what));
  }
  return text;
}

// The gRPC port's credentials from the --tls_* flags; a description for the startup log in `mode`.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const std::string& cert_path,
                                                                           const std::string& key_path,
                                                                           const std::string& ca_path,
                                                                           std::string* mode,
                                                                           txl::HttpServerConfig* http) {
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(cert_path.empty() ? "--tls_key needs --tls_cert" : "--tls_cert needs --tls_key");
  }
  if (cert_path.empty()) {
    if (!ca_path.empty()) return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    *mode = "plaintext (no TLS)";
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(std::string cert, ReadPem("tls_cert", cert_path, "-----BEGIN CERTIFICATE-----", "certificate"));
  ASSIGN_OR_RETURN(std::string key, ReadPem("tls_key", key_path, "PRIVATE KEY-----", "private key"));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  *mode = "TLS";
  if (!ca_path.empty()) {
    ASSIGN_OR_RETURN(std::string ca, ReadPem("tls_client_ca", ca_path, "-----BEGIN CERTIFICATE-----", "certificate"));
    options = grpc::SslServerCredentialsOptions(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = std::move(ca);
    *mode = "TLS, client certificates required (mutual TLS)";
  }
  // The HTTP port uses the same certificate, key and client CA.
  http->tls_cert_pem = cert;
  http->tls_key_pem = key;
  http->tls_client_ca_pem = options.pem_root_certs;
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(options);
}

// The gRPC server: the service, health and reflection on one port, with the
// transport's bounds.
std::unique_ptr<grpc::Server> StartGrpc(const ServerOptions& o, std::shared_ptr<grpc::ServerCredentials> credentials,
                                        txl::TxlService* service, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second server on a busy port
  // silently shares it instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC answers a bigger request with RESOURCE_EXHAUSTED before any handler runs.
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  // The whole transport's memory and threads are bounded, whatever clients do.
  grpc::ResourceQuota quota("txl-server");
  if (o.grpc_memory_quota > 0) quota.Resize(static_cast<size_t>(o.grpc_memory_quota));
  if (o.grpc_max_threads > 0) quota.SetMaxThreads(o.grpc_max_threads);
  builder.SetResourceQuota(quota);
  // Idle connections cost a socket and buffers each: closed after a while
  // (clients reconnect on their next call).
  if (o.max_connection_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(std::min(absl::ToDoubleMilliseconds(o.max_connection_idle), 2e9)));
  }
  // Health and reflection share this port and its TLS; they need no token (service.h).
  builder.AddListeningPort(o.listen, std::move(credentials), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// Bearer tokens (--auth_tokens), or none.
absl::StatusOr<std::unique_ptr<txl::BearerTokens>> LoadTokens(const ServerOptions& o) {
  if (o.auth_tokens.empty()) return nullptr;
  auto loaded = txl::BearerTokens::Create({o.auth_tokens});
  if (!loaded.ok()) return absl::InvalidArgumentError(absl::StrCat("--auth_tokens: ", loaded.status().message()));
  if (o.tls_cert.empty()) {
    std::cerr << "txl-server: warning: --auth_tokens without --tls_cert: bearer tokens cross the network "
                 "in clear text"
              << std::endl;
  }
  return *std::move(loaded);
}

// The settings that depend on the loaded model: the default window, the
// import limit, the device and number formats it runs in, and on a GPU the
// session memory budget and its pool. `pools` then hold their rows within
// the session memory budget together.
absl::Status FitToModel(txl::ModelEngine* engine, int64_t later_versions_bytes, txl::SharedSlotPools* pools,
                        ServerOptions* o) {
  const txl::LanguageModel& model = engine->model();
  const txl::ModelConfig& mc = model.config();
  if (o->service.default_mem_len == 0) {
    // Each version's own, at most --max_mem_len (DefaultMemLenOf); the first's sizes the budgets.
    o->service.default_mem_len_from_model = true;
    o->service.default_mem_len = std::clamp<int64_t>(mc.mem_len, 1, o->service.max_mem_len);
  }
  if (o->service.default_mem_len > o->service.max_mem_len) {
    return absl::InvalidArgumentError(absl::StrCat("--default_mem_len ", o->service.default_mem_len,
                                                   " exceeds --max_mem_len ", o->service.max_mem_len));
  }
  // An import carries one session: at most a full window of max_mem_len, plus headers.
  o->service.max_import_bytes = model.FullMemoryBytes(o->service.max_mem_len) + (int64_t{1} << 20);
  o->service.device = model.device();
  if (o->table.memory_budget_bytes == -1) {
    // What is free once the weights are there, less headroom (and on a CPU the other host budgets):
    // a full machine refuses new sessions (RESOURCE_EXHAUSTED), not a batch or the OOM killer.
    const int64_t window = model.FullMemoryBytes(o->service.default_mem_len);
    if (model.device() == "cpu") {
      ASSIGN_OR_RETURN(const txl::HostMemory host, txl::ReadHostMemory());
      txl::HostBudgetConfig budget =
          txl::HostBudgetOf(o->table, host, o->host_headroom, window, o->service.default_mem_len);
      budget.later_versions = later_versions_bytes;
      ASSIGN_OR_RETURN(o->table.memory_budget_bytes, txl::DefaultHostBudget(budget));
      std::cerr << "txl-server: session memory budget " << o->table.memory_budget_bytes << " bytes ("
                << txl::DescribeHostBudget(budget) << ")" << std::endl;
    } else {
      auto memory = txl::CudaDeviceMemory();
      if (!memory.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("sizing the session budget on ", model.device(), ": ",
                                                          memory.status().message(),
                                                          " (give --session_memory_budget)"));
      }
      txl::DeviceBudgetConfig budget;
      budget.device = model.device();
      budget.memory = *memory;
      budget.headroom = o->gpu_headroom;
      budget.window_bytes = window;
      budget.default_mem_len = o->service.default_mem_len;
      budget.later_versions = later_versions_bytes;
      ASSIGN_OR_RETURN(o->table.memory_budget_bytes, txl::DefaultDeviceBudget(budget));
      std::cerr << "txl-server: session memory budget " << o->table.memory_budget_bytes << " bytes (" << model.device()
                << ": " << memory->free_bytes << " free of " << memory->total_bytes << ", less "
                << txl::DeviceHeadroom(budget) << " headroom"
                << (later_versions_bytes > 0 ? absl::StrCat(" and ", later_versions_bytes, " for later model versions")
                                             : "")
                << ")" << std::endl;
    }
  }
  // The pools of every shape together (PoolBudget): the pool reserved below
  // gives its free top to another architecture's. Offload admits sessions
  // past the budget and moves idle ones out after the step, so there the
  // pools grow past it by what a step needs, where admission would refuse.
  if (pools != nullptr && o->table.memory_budget_bytes > 0) {
    txl::PoolBudgetConfig budget;
    budget.limit_bytes = o->table.memory_budget_bytes;
    budget.grow_past = o->table.host_memory_budget_bytes > 0;
    pools->Limit(budget);
  }
  if (model.device() != "cpu" && o->table.memory_budget_bytes > 0) {
    // The pool of session memory, allocated once for the whole budget:
    // admission then keeps every step within it (docs/OPERATIONS.md, "Flags",
    // --kernels).
    if (auto reserved = engine->ReserveSessionMemory(o->table.memory_budget_bytes); !reserved.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(reserved.message(), " (lower --session_memory_budget or raise --gpu_headroom)"));
    }
  }
  o->metrics.session_memory_budget = o->table.memory_budget_bytes;
  // What the model runs in, not what the flags asked for (GetModelInfo reports it).
  o->service.dtype = txl::DtypeName(model.dtype());
  o->service.cpu_family = model.CpuFamily();
  o->service.kv_dtype = txl::DtypeName(model.kv_dtype());
  o->metrics.info = {{"version", "0.1.0"},
                     {"model", o->model.path},
                     {"device", model.device()},
                     {"n_layer", std::to_string(mc.n_layer)},
                     {"d_model", std::to_string(mc.d_model)}};
  return absl::OkStatus();
}

// What a server serves: --model's one version, or --model_repository's
// ready versions and the poller that keeps them current.
struct ServedModels {
  std::unique_ptr<txl::ModelRepository> repository;
  std::unique_ptr<txl::RepositoryPoller> poller;
  std::unique_ptr<txl::ModelSource> source;
  // The session pools, one per shape (SharedSlotPools): a repository's
  // versions share them, and a --model file's pool counts as theirs do.
  std::shared_ptr<txl::SharedSlotPools> pools = std::make_shared<txl::SharedSlotPools>();
  // The settings that follow a model follow this one (FitToModel); held
  // only until the server has started.
  std::shared_ptr<txl::ServedModel> first;
  std::string what;  // for the start-up lines
  // What the model memory budget leaves for versions loaded later: set
  // aside from the default session memory budget (FitToModel).
  int64_t later_versions_bytes = 0;
};

// --model_memory_budget -1: room for each start-up version to roll over at
// its size (twice what they hold), and at least a quarter of the memory the
// weights live in, for new versions larger than the old. The figure, and how
// it was chosen.
absl::StatusOr<std::pair<int64_t, std::string>> DefaultModelBudget(const ServerOptions& o, int64_t held) {
  int64_t quarter = 0;
  std::string of;
  if (o.model.device == "cpu") {
    ASSIGN_OR_RETURN(const txl::HostMemory host, txl::ReadHostMemory());
    quarter = host.available_bytes / 4;
    of = "the host's available memory";
  } else {
    absl::StatusOr<txl::DeviceMemory> device = txl::CudaDeviceMemory();
    if (!device.ok()) {
      return absl::Status(
          device.status().code(),
          absl::StrCat("sizing --model_memory_budget: ", device.status().message(), " (give --model_memory_budget)"));
    }
    quarter = device->free_bytes / 4;
    of = o.model.device + "'s free memory";
  }
  if (2 * held >= quarter) return std::make_pair(2 * held, absl::StrCat("twice the start-up versions' ", held));
  return std::make_pair(quarter, absl::StrCat("a quarter of ", of, ", more than twice the start-up versions'"));
}

absl::StatusOr<ServedModels> OpenModels(const ServerOptions& o) {
  ServedModels m;
  txl::LanguageModelOptions options = o.model;
  options.shared_pools = m.pools;
  if (o.repository.dir.empty()) {
    auto engine = txl::ModelEngine::Create(options);
    if (!engine.ok()) return engine.status();
    (*engine)->JoinSharedPool();  // its pool then counts against the session memory budget (FitToModel)
    const txl::LanguageModel& model = (*engine)->model();
    // A repository of one: the file's stem, version 1 (docs/OPERATIONS.md, "Model repository").
    m.first = std::make_shared<txl::ServedModel>(std::filesystem::path(o.model.path).stem().string(), 1,
                                                 *std::move(engine), model.config(), model.tokenizer(), o.model.path);
    m.source = txl::SingleModel(m.first);
    m.what = o.model.path;
    return m;
  }
  // The server's flags are every model's ceilings; a model's limits.json may lower them.
  txl::ModelLimits ceilings;  // what a model's limits.json may lower but not raise
  ceilings.max_mem_len = o.service.max_mem_len;
  ceilings.max_new_tokens = o.service.max_new_tokens;
  ceilings.max_input_tokens = o.service.max_input_tokens;
  ceilings.max_sessions = o.table.max_sessions;
  // Versions of one shape share one session pool on the generic path (a GPU):
  // the pool reserved for the session budget below serves a rollout's old and
  // new versions alike.
  auto repository = txl::ModelRepository::Create(o.repository, txl::ServedModelLoader(options, ceilings),
                                                 txl::ServedModelSizer(o.model));
  if (!repository.ok()) {
    return absl::Status(repository.status().code(),
                        absl::StrCat("--model_repository: ", repository.status().message()));
  }
  m.repository = *std::move(repository);
  m.source = txl::RepositoryModels(m.repository.get());
  const std::vector<std::shared_ptr<txl::ServedModel>> ready = m.source->Ready();
  std::vector<std::string> states;
  for (const txl::VersionStatus& v : m.repository->List()) {
    states.push_back(absl::StrCat(v.model, "@", v.version, " ", txl::VersionStateName(v.state),
                                  v.reason.empty() ? "" : ": " + v.reason));
  }
  if (ready.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--model_repository ", o.repository.dir, ": no version is ready (",
                     states.empty() ? "none found" : absl::StrJoin(states, "; "), ")"));
  }
  m.first = ready.front();
  const int64_t held = m.repository->HeldBytes();
  int64_t budget = o.repository.memory_budget_bytes;
  std::string how = "--model_memory_budget";
  if (o.model_memory_budget == -1) {
    ASSIGN_OR_RETURN(std::tie(budget, how), DefaultModelBudget(o, held));
    RETURN_IF_ERROR(m.repository->SetMemoryBudget(budget, absl::StrCat(" (the default: ", how, ")")));
  }
  if (budget > 0) {
    m.later_versions_bytes = std::max<int64_t>(0, budget - held);
    std::cerr << "txl-server: model memory budget " << budget << " bytes (" << how << "): the start-up versions hold "
              << held << ", which leaves " << m.later_versions_bytes << " for versions loaded later" << std::endl;
  }
  txl::RepositoryPollerConfig poller;
  poller.interval = o.repository_poll;
  poller.nice_increment = o.repository_load_nice;
  m.poller = std::make_unique<txl::RepositoryPoller>(m.repository.get(), poller);
  // A version's last session may end on the engine thread: its weights are freed on the poller's.
  m.repository->SetReleaser(m.poller->Releaser());
  m.what = absl::StrCat("repository ", o.repository.dir, " (", absl::StrJoin(states, ", "), ")");
  return m;
}

// The state store (--state_dir / --state_redis), or none.
absl::StatusOr<std::unique_ptr<txl::SessionJournal>> OpenStateStore(const ServerOptions& o) {
  if (!o.state_store) return nullptr;
  auto backend = txl::OpenStateBackend(o.backend);
  if (!backend.ok())
    return absl::Status(backend.status().code(), absl::StrCat("state store: ", backend.status().message()));
  auto opened = txl::SessionJournal::Create(o.journal, *std::move(backend));
  if (!opened.ok())
    return absl::Status(opened.status().code(), absl::StrCat("state store: ", opened.status().message()));
  return *std::move(opened);
}

// With a state store and a state cache, the cache's entries go to the store
// too, through a connection of their own, so that replicas share them.
absl::StatusOr<std::unique_ptr<txl::SharedStateCache>> OpenSharedStateCache(const ServerOptions& o) {
  if (!o.state_store || o.table.state_cache.budget_bytes == 0) return nullptr;
  txl::StateBackendConfig config = o.backend;
  config.writer = o.backend.writer + "-cache";  // its temporary files are not the journal's
  auto backend = txl::OpenStateBackend(config);
  if (!backend.ok())
    return absl::Status(backend.status().code(), absl::StrCat("state cache store: ", backend.status().message()));
  return std::make_unique<txl::SharedStateCache>(*std::move(backend), txl::SharedStateCacheConfig{});
}

// /metrics on its own port, on the same HTTP transport as the API; null
// without --metrics_listen.
absl::StatusOr<std::unique_ptr<txl::HttpServer>> StartMetricsPort(const ServerOptions& o, txl::Metrics* metrics) {
  if (o.metrics_listen.empty()) return nullptr;
  txl::HttpServerConfig scrape;
  scrape.listen = o.metrics_listen;
  scrape.threads = 1;
  scrape.max_body_bytes = 1 << 16;
  scrape.max_connections = 64;
  auto started = txl::HttpServer::Create(scrape, txl::MetricsRoute([metrics] { return metrics->Scrape(); }));
  if (!started.ok()) {
    return absl::Status(started.status().code(), absl::StrCat("--metrics_listen: ", started.status().message()));
  }
  return started;
}

// host:port with the port the server got (the flag may say 0).
std::string BoundAddress(const std::string& listen, int port) {
  return listen.substr(0, listen.rfind(':') + 1) + std::to_string(port);
}

// The five start-up lines (docs/OPERATIONS.md, "Startup, logs and exit codes").
void PrintStarted(const ServerOptions& o, const txl::LanguageModel& model, const std::string& what, int port,
                  const txl::HttpServer* metrics_http, const txl::HttpServer* http, const std::string& transport,
                  const txl::BearerTokens* tokens) {
  const txl::ModelConfig& mc = model.config();
  std::cout << "txl-server: listening on " << BoundAddress(o.listen, port)
            << (metrics_http ? ", metrics on " + BoundAddress(o.metrics_listen, metrics_http->port()) : "")
            << "\ntxl-server: model " << what << " (n_layer " << mc.n_layer << ", d_model " << mc.d_model << ", "
            << mc.n_token << " tokens, default mem_len " << o.service.default_mem_len << ") on " << model.device()
            << "\ntxl-server: device " << model.device() << ", dtype " << o.service.dtype << ", kv_dtype "
            << o.service.kv_dtype << ", kernels " << model.KernelPath() << "\ntxl-server: http "
            << (http ? "on " + BoundAddress(o.http.listen, http->port()) : std::string("off"))
            << "\ntxl-server: " << transport << ", "
            << (tokens ? absl::StrCat(tokens->size(), " bearer token(s) from ", o.auth_tokens)
                       : std::string("no authentication"))
            << std::endl;
}

// After SIGTERM/SIGINT: refuse new work, let what runs finish within
// --drain_timeout, cancel the rest, and leave snapshots behind.
void DrainAndStop(const ServerOptions& o, int sig, txl::Scheduler* scheduler, grpc::Server* server,
                  txl::OpenAiGateway* gateway, txl::HttpServer* http, txl::RepositoryPoller* poller) {
  // Refuse first, then say so: a client that sees NOT_SERVING (or this line) is never accepted after it.
  // The HTTP port keeps accepting for the whole drain, so that a probe on a new connection reads
  // /readyz's 503 "draining" rather than a refused connection (new work there gets 503 too).
  scheduler->Drain();
  server->GetHealthCheckService()->SetServingStatus(false);
  if (http) gateway->SetDraining();
  std::cout << "txl-server: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining" << std::endl;
  // The repository's thread answers loads and unloads through the transports: it stops (its
  // queued work done, later requests refused as UNAVAILABLE) while they still run.
  if (poller) poller->Stop();
  // An HTTP answer is done when its last byte is written, which may be after its job ended.
  auto http_busy = [&] { return http && (gateway->active() > 0 || http->requests_in_flight() > 0); };
  const absl::Time deadline = absl::Now() + o.drain_timeout;
  while (absl::Now() < deadline && (scheduler->active() > 0 || scheduler->queue_depth() > 0 || http_busy())) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (http) http->StopAccepting();
  // What is still running is cancelled; its sessions keep what was delivered.
  scheduler->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // The gateway's completions end with their jobs and write their last events; then the
  // transport's threads.
  for (int i = 0; http_busy() && i < 100; ++i) absl::SleepFor(absl::Milliseconds(20));
  if (http) http->Stop();
  // A graceful stop leaves snapshots, so the next start (here or on another
  // replica) replays nothing; the journal's destructor then retires this
  // replica's heartbeat, which lets another replica take its sessions at once.
  if (auto s = scheduler->SnapshotAll(); !s.ok())
    std::cerr << "txl-server: final snapshots: " << s.message() << std::endl;
}

}  // namespace

int Serve(ServerOptions o, sigset_t signals) {
  // Security first: a mistake there should not wait for the model to load.
  std::string transport;
  auto credentials = ServerCredentials(o.tls_cert, o.tls_key, o.tls_client_ca, &transport, &o.http);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  auto tokens = LoadTokens(o);
  if (!tokens.ok()) return Fail(std::string(tokens.status().message()));

  auto models = OpenModels(o);
  if (!models.ok()) return Fail(std::string(models.status().message()));
  auto* first_engine = dynamic_cast<txl::ModelEngine*>(models->first->engine());
  if (first_engine == nullptr) return Fail("the model's engine is not a ModelEngine");
  if (absl::Status fit = FitToModel(first_engine, models->later_versions_bytes, models->pools.get(), &o); !fit.ok())
    return Fail(std::string(fit.message()));
  const txl::LanguageModel& model = first_engine->model();
  const txl::ModelSource* service_models = models->source.get();
  txl::ReleaseFreedMemory();  // the load's temporaries: --malloc_keep_bytes would keep them resident

  // The state store, before anything is served: a restart finds its sessions first.
  auto journal = OpenStateStore(o);
  if (!journal.ok()) return Fail(std::string(journal.status().message()));
  txl::SessionTable table(o.table);
  if (*journal) {
    auto recovered =
        txl::RecoverSessions(journal->get(), &table, txl::RecordsOf(service_models, models->repository.get()));
    if (!recovered.ok()) return Fail(absl::StrCat("state store: ", recovered.status().message()));
    std::cout << "txl-server: state store " << (*journal)->Describe() << " as replica " << (*journal)->replica() << ": "
              << *recovered << " session(s) recovered";
    if (const int64_t waiting = (*journal)->waiting(); waiting > 0) {
      std::cout << ", " << waiting << " kept waiting for room for their version under --model_memory_budget";
    }
    std::cout << std::endl;
  }

  o.metrics.versions = [service_models] { return service_models->List(); };
  if (*journal) o.metrics.waiting_sessions = [j = journal->get()] { return j->waiting(); };
  o.metrics.session_pool_bytes = [pools = models->pools] { return pools->held_bytes(); };
  auto metrics = txl::Metrics::Create(o.metrics, &table);
  if (!metrics.ok()) return Fail(std::string(metrics.status().message()));
  auto metrics_http = StartMetricsPort(o, metrics->get());
  if (!metrics_http.ok()) return Fail(std::string(metrics_http.status().message()));

  // Before the scheduler, so that it outlives the engine thread that offers it entries.
  auto shared_cache = OpenSharedStateCache(o);
  if (!shared_cache.ok()) return Fail(std::string(shared_cache.status().message()));
  txl::Scheduler scheduler(o.scheduler, &table, metrics->get());
  scheduler.SetJournal(journal->get());
  scheduler.SetSharedStateCache(shared_cache->get());
  txl::TxlService service(txl::ServiceParts{o.service, service_models, models->repository.get(), models->poller.get(),
                                            &table, &scheduler, metrics->get(), tokens->get(), journal->get()});
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpc(o, *std::move(credentials), &service, &port);
  if (!server || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", o.listen,
                             o.tls_cert.empty()
                                 ? " (address in use?)"
                                 : " (address in use, or --tls_cert/--tls_key not a matching certificate and key?)"));
  }
  // The HTTP front end calls the service core as the gRPC service does
  // (server/http/openai_gateway.h).
  std::unique_ptr<txl::OpenAiGateway> gateway;
  std::unique_ptr<txl::HttpServer> http;
  if (!o.http.listen.empty()) {
    gateway =
        std::make_unique<txl::OpenAiGateway>(txl::OpenAiGatewayConfig{o.chat_template}, service.core(), metrics->get());
    auto started = txl::HttpServer::Create(
        o.http, [g = gateway.get()](std::shared_ptr<txl::HttpExchange> x) { g->Handle(std::move(x)); });
    if (!started.ok()) return Fail(absl::StrCat("--http_listen: ", started.status().message()));
    http = *std::move(started);
  }
  scheduler.Start();
  // Sessions recovered waiting for room for their version come back once a
  // poll, an unload or a freed version makes room (the poller stops before
  // the scheduler, in DrainAndStop).
  if (*journal && models->poller) {
    auto readmitter = std::make_shared<txl::WaitingReadmitter>(
        journal->get(), models->repository.get(), &scheduler,
        [poller = models->poller.get()] { poller->Run([] {}); });  // outlives the scheduler's jobs
    models->poller->SetFollowUp([readmitter] { return readmitter->Run().again; });
    models->poller->Run([] {});  // one now: the start-up's retirements may have made room already
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  PrintStarted(o, model, models->what, port, metrics_http->get(), http.get(), transport, tokens->get());
  // Held no longer: a repository version is freed when its last holder lets go.
  models->first.reset();

  int sig = 0;
  sigwait(&signals, &sig);
  DrainAndStop(o, sig, &scheduler, server.get(), gateway.get(), http.get(), models->poller.get());
  std::cout << "txl-server: stopped" << std::endl;
  return 0;
}

}  // namespace txl
