// txl-server: serves a Transformer-XL checkpoint over gRPC with stateful
// sessions. Wiring only: the flags live here and become config structs in
// one place (OptionsFromFlags); Serve builds the parts from them, bottom up.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/flags_help.h"
#include "base/host_memory.h"
#include "base/malloc_tuning.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "model/device_memory.h"
#include "server/batching/scheduler.h"
#include "server/core/auth.h"
#include "server/durability/recovery.h"
#include "server/durability/session_journal.h"
#include "server/durability/shared_state_cache.h"
#include "server/durability/state_backend.h"
#include "server/engine/model_engine.h"
#include "server/engine/served_model.h"
#include "server/grpc/service.h"
#include "server/http/http_server.h"
#include "server/http/metrics_route.h"
#include "server/http/openai_gateway.h"
#include "server/metrics/metrics.h"
#include "server/sessions/device_budget.h"
#include "server/sessions/host_budget.h"
#include "server/sessions/session_table.h"

#ifndef TXL_BUNDLED_MODEL
#define TXL_BUNDLED_MODEL "model/bundled/shakespeare_char.pt"
#endif

ABSL_FLAG(std::string, model, "",
          "checkpoint to serve (empty: the bundled model, beside an installed binary in ../model/, "
          "else in the source tree)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8080",
          "HTTP address: OpenAI-style completions, health, models (empty: off; docs/API.md)");
ABSL_FLAG(int, http_threads, 2, "threads of the HTTP transport (they never block)");
ABSL_FLAG(int64_t, http_max_body_bytes, 4 << 20, "largest HTTP request body (bigger: 413)");
ABSL_FLAG(int, http_max_connections, 1024,
          "open HTTP connections; at the bound a new one closes the connection that has waited longest with no "
          "request in flight (idle, or still sending its request); with none, the new one is closed at once");
ABSL_FLAG(int64_t, http_header_timeout_ms, 10000,
          "milliseconds an HTTP request's head may take, from its first byte (on a new connection: from the "
          "accept, TLS handshake included); slower, the connection is closed");
ABSL_FLAG(std::string, chat_template, "",
          "JSON file of the chat template /v1/chat/completions renders messages with (empty: the built-in one; "
          "docs/HTTP.md)");
ABSL_FLAG(std::string, http_allow_origin, "",
          "comma-separated origins allowed by CORS on the HTTP port, or * (empty: no CORS headers)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464", "Prometheus /metrics address (empty: off)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(int, threads, 0, "intra-op threads for the model (0: libtorch default)");
ABSL_FLAG(std::string, dtype, "float32",
          "weights of the layers' products: float32 (exact), bfloat16 or int8 (per-row scales)");
ABSL_FLAG(std::string, kv_dtype, "float32", "sessions' keys and values: float32 or bfloat16 (half the bytes)");
ABSL_FLAG(std::string, kernels, "auto",
          "auto (the CPU's own kernels on a CPU, libtorch ops on a GPU) or generic (libtorch ops everywhere: "
          "the GPU's code, on a CPU too; slower there)");
ABSL_FLAG(std::string, cuda_graphs, "auto",
          "decode steps (one token per session) as CUDA graphs, captured once per bucket of sessions and "
          "keys and replayed: auto (on a GPU), on or off. On a CPU, 'on' needs --kernels generic, where the "
          "same padded steps run eagerly (for testing)");
ABSL_FLAG(int, max_batch, 32, "requests advanced together per engine step");
ABSL_FLAG(int, max_batch_tokens, 2048, "tokens fed per engine step");
ABSL_FLAG(int, prefill_chunk, 256, "tokens one request feeds per step while prefilling");
ABSL_FLAG(int, max_queue, 256, "waiting requests before RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_sessions, 1000, "live sessions before RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, session_memory_budget, -1,
          "bytes of session memory (each session counted at its full window) before "
          "RESOURCE_EXHAUSTED; 0: no limit; -1: what the host (or the container) has available once the model "
          "is loaded, less --host_headroom and the other host budgets; on a GPU what the device has free, less "
          "--gpu_headroom");
ABSL_FLAG(int, malloc_arenas, 1,
          "glibc malloc arenas (M_ARENA_MAX; 0: glibc's default of 8 per core). One keeps the resident "
          "memory of a busy server from creeping up across per-thread arenas");
ABSL_FLAG(int64_t, malloc_keep_bytes, int64_t{256} << 20,
          "freed memory glibc keeps for reuse (M_TRIM_THRESHOLD; blocks up to 32 MiB then come from its heap, "
          "not mmap); 0: glibc's defaults, under which a long prefill's activations are faulted in anew on "
          "every pass");
ABSL_FLAG(int64_t, host_headroom, 0,
          "bytes of host memory the default --session_memory_budget leaves free on a CPU, for a step's work "
          "and the process (0: 10% of the host's or the container's memory)");
ABSL_FLAG(int64_t, gpu_headroom, 0,
          "bytes a GPU keeps free beyond the default --session_memory_budget, for a step's work "
          "(0: 10% of the device, at least 1 GiB)");
ABSL_FLAG(int64_t, session_ttl, 600, "default idle seconds before a session expires");
ABSL_FLAG(int64_t, max_session_ttl, 86400, "largest idle_ttl_seconds a client may ask for");
ABSL_FLAG(int64_t, default_mem_len, 0, "a new session's window (0: the model's mem_len)");
ABSL_FLAG(int64_t, max_mem_len, 4096, "largest mem_len a client may ask for");
ABSL_FLAG(int, max_new_tokens, 4096, "largest max_new_tokens a request may ask for");
ABSL_FLAG(int64_t, max_input_tokens, 65536, "largest input of one request, in tokens");
ABSL_FLAG(double, drain_timeout, 10, "seconds in-flight requests get to finish on SIGTERM");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the gRPC port (with --tls_key; empty: plaintext)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: when set, clients must present a certificate issued by one of them (mutual TLS)");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of 'TOKEN PRINCIPAL' lines: every txl.v1 call then needs 'authorization: Bearer TOKEN' "
          "(empty: no authentication)");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20, "largest request message the gRPC port accepts");
ABSL_FLAG(int64_t, max_sessions_per_principal, 0,
          "live sessions one principal may hold before RESOURCE_EXHAUSTED; 0: no limit");
ABSL_FLAG(std::string, state_dir, "",
          "directory that keeps every session durably (write-ahead token log + snapshots); sessions survive a "
          "crash or restart, and replicas sharing it can take over each other's sessions (empty: off)");
ABSL_FLAG(std::string, state_store, "",
          "instead of --state_dir: redis://HOST:PORT[/PREFIX], a Redis server as the shared session store");
ABSL_FLAG(std::string, fsync, "interval",
          "always: fsync before every acknowledgement; interval: fsync every --fsync_interval_ms; never: leave it "
          "to the OS (every mode survives a process crash; see docs/OPERATIONS.md)");
ABSL_FLAG(int64_t, fsync_interval_ms, 1000, "how often --fsync=interval syncs");
ABSL_FLAG(std::string, replica_name, "",
          "this replica's name in the state store (default: the host name); keep it stable across restarts");
ABSL_FLAG(int64_t, snapshot_tokens, 4096,
          "tokens logged per session between two snapshots of its state (bounds the replay at a restart)");
ABSL_FLAG(double, holder_timeout, 10, "seconds without a heartbeat before a replica's sessions may be taken over");
ABSL_FLAG(int64_t, session_history_tokens, 65536,
          "history tokens each session keeps in memory, so that RewindSession and ForkSession at a position can "
          "rebuild its state by replay (4 bytes each; 0: all); with a state store its log keeps all of them");
ABSL_FLAG(int64_t, state_cache_budget, 256ll << 20,
          "bytes of host memory for the states of requests without a session (the state cache: a request "
          "that repeats their tokens goes on from there; least recently used first out); 0: no cache");
ABSL_FLAG(int64_t, checkpoint_budget, 256ll << 20,
          "bytes of host memory for turn checkpoints (a session's state kept at the end of each Generate or "
          "committing Score), so that going back a turn costs a copy, not a replay; least recently used go "
          "first. 0: none (rewinds replay)");
ABSL_FLAG(int64_t, host_memory_budget, 0,
          "bytes of host memory for idle sessions moved out of --session_memory_budget (offload; least recently "
          "used first; with a state store, beyond it they live in the store only). 0: no offload");

ABSL_FLAG(int64_t, max_stream_buffer_bytes, 256 << 10,
          "Generate/Converse output one call may hold for a client that reads slowly; past it the call's "
          "session waits (other sessions go on) until the client reads");
ABSL_FLAG(double, stream_stall_timeout, 30,
          "seconds a call may wait on a client that reads none of its output before it is cancelled");
ABSL_FLAG(int64_t, grpc_memory_quota, int64_t{1} << 30,
          "bytes the gRPC transport may use for all connections and calls together (0: no quota)");
ABSL_FLAG(int, grpc_max_threads, 0, "threads gRPC may run for the server (0: gRPC's default)");
ABSL_FLAG(double, max_connection_idle, 300,
          "seconds a connection with no call in flight stays open before the server closes it (0: forever)");

namespace {

int Fail(const std::string& msg) {
  std::cerr << "txl-server: " << msg << std::endl;
  return 1;
}

// The bundled model: installed next to the binary (P/bin/txl-server and
// P/model/, see the top-level CMakeLists.txt), else the source tree's.
std::string BundledModel() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = exe.parent_path().parent_path() / "model" / "shakespeare_char.pt";
    if (std::filesystem::exists(installed, ec)) return installed.string();
  }
  return TXL_BUNDLED_MODEL;
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

// Every flag, as the config structs of the parts it sets: the one place
// flags are read (OptionsFromFlags). The rest of main only wires parts.
struct ServerOptions {
  txl::LanguageModelOptions model;
  txl::ServiceConfig service;  // default_mem_len 0: the model's, once it is loaded
  txl::SessionTableConfig table;
  txl::SchedulerConfig scheduler;
  txl::MetricsConfig metrics;
  bool state_store = false;  // with backend and journal:
  txl::StateBackendConfig backend;
  txl::SessionJournalConfig journal;
  txl::HttpServerConfig http;  // listen empty: no HTTP port
  std::string metrics_listen;  // empty: no /metrics
  txl::ChatTemplate chat_template;
  // The gRPC port.
  std::string listen, auth_tokens, tls_cert, tls_key, tls_client_ca;
  int max_message_bytes = 0;
  int64_t grpc_memory_quota = 0;
  int64_t gpu_headroom = 0;   // 0: 10% of the device, at least 1 GiB
  int64_t host_headroom = 0;  // 0: 10% of the host
  int grpc_max_threads = 0;
  absl::Duration max_connection_idle, drain_timeout;
};

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions o;
  o.model.path = absl::GetFlag(FLAGS_model).empty() ? BundledModel() : absl::GetFlag(FLAGS_model);
  o.model.device = absl::GetFlag(FLAGS_device);
  o.model.threads = absl::GetFlag(FLAGS_threads);
  // The parsers' messages name the flag and the allowed values.
  ASSIGN_OR_RETURN(o.model.dtype, txl::ParseWeightDtype(absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(o.model.kv_dtype, txl::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype)));
  ASSIGN_OR_RETURN(o.model.kernels, txl::ParseKernels(absl::GetFlag(FLAGS_kernels)));
  ASSIGN_OR_RETURN(o.model.decode_graphs, txl::ParseDecodeGraphs(absl::GetFlag(FLAGS_cuda_graphs)));

  const int64_t max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message_bytes < 1 || max_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes must be in [1, ",
                                                   std::numeric_limits<int>::max(), "], got ", max_message_bytes));
  }
  o.max_message_bytes = static_cast<int>(max_message_bytes);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout));

  o.http.listen = absl::GetFlag(FLAGS_http_listen);
  o.http.threads = absl::GetFlag(FLAGS_http_threads);
  o.http.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  o.http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  const int64_t header_timeout_ms = absl::GetFlag(FLAGS_http_header_timeout_ms);
  if (header_timeout_ms < 1)
    return absl::InvalidArgumentError(absl::StrCat("--http_header_timeout_ms must be >= 1, got ", header_timeout_ms));
  o.http.header_timeout = absl::Milliseconds(header_timeout_ms);
  o.http.write_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_stall_timeout));
  for (absl::string_view origin : absl::StrSplit(absl::GetFlag(FLAGS_http_allow_origin), ',', absl::SkipWhitespace())) {
    o.http.allow_origins.emplace_back(origin);
  }
  ASSIGN_OR_RETURN(o.chat_template, txl::ChatTemplate::Load(absl::GetFlag(FLAGS_chat_template)));
  if (o.http.threads < 1 || o.http.threads > 64) return absl::InvalidArgumentError("--http_threads must be in [1, 64]");
  if (o.http.max_body_bytes < 1) return absl::InvalidArgumentError("--http_max_body_bytes must be >= 1");
  if (o.http.max_connections < 1) return absl::InvalidArgumentError("--http_max_connections must be >= 1");

  txl::ServiceConfig& service = o.service;
  service.default_mem_len = std::max<int64_t>(0, absl::GetFlag(FLAGS_default_mem_len));
  service.max_mem_len = absl::GetFlag(FLAGS_max_mem_len);
  service.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  service.max_input_tokens = absl::GetFlag(FLAGS_max_input_tokens);
  service.model_path = o.model.path;
  service.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  if (service.max_stream_buffer_bytes < 1) return absl::InvalidArgumentError("--max_stream_buffer_bytes must be >= 1");

  txl::SessionTableConfig& table = o.table;
  table.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  table.default_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl));
  table.max_ttl = absl::Seconds(absl::GetFlag(FLAGS_max_session_ttl));
  table.memory_budget_bytes = absl::GetFlag(FLAGS_session_memory_budget);
  table.max_sessions_per_principal = absl::GetFlag(FLAGS_max_sessions_per_principal);
  if (table.max_sessions < 1 || table.memory_budget_bytes < -1)
    return absl::InvalidArgumentError("--max_sessions must be >= 1 and --session_memory_budget >= -1");
  o.gpu_headroom = absl::GetFlag(FLAGS_gpu_headroom);
  o.host_headroom = absl::GetFlag(FLAGS_host_headroom);
  if (o.gpu_headroom < 0) return absl::InvalidArgumentError("--gpu_headroom must be >= 0");
  if (o.host_headroom < 0) return absl::InvalidArgumentError("--host_headroom must be >= 0");
  if (table.max_sessions_per_principal < 0)
    return absl::InvalidArgumentError("--max_sessions_per_principal must be >= 0");
  table.host_memory_budget_bytes = absl::GetFlag(FLAGS_host_memory_budget);
  if (table.host_memory_budget_bytes < 0) return absl::InvalidArgumentError("--host_memory_budget must be >= 0");
  table.history_tokens = absl::GetFlag(FLAGS_session_history_tokens);
  if (table.history_tokens < 0) return absl::InvalidArgumentError("--session_history_tokens must be >= 0");
  table.checkpoints.budget_bytes = absl::GetFlag(FLAGS_checkpoint_budget);
  if (table.checkpoints.budget_bytes < 0) return absl::InvalidArgumentError("--checkpoint_budget must be >= 0");
  table.state_cache.budget_bytes = absl::GetFlag(FLAGS_state_cache_budget);
  if (table.state_cache.budget_bytes < 0) return absl::InvalidArgumentError("--state_cache_budget must be >= 0");

  if (!absl::GetFlag(FLAGS_state_dir).empty() && !absl::GetFlag(FLAGS_state_store).empty())
    return absl::InvalidArgumentError("--state_dir and --state_store: give one of them");
  const std::string state_spec = !absl::GetFlag(FLAGS_state_store).empty() ? absl::GetFlag(FLAGS_state_store)
                                 : absl::GetFlag(FLAGS_state_dir).empty()  ? ""
                                                                           : "dir:" + absl::GetFlag(FLAGS_state_dir);
  if (!state_spec.empty()) {
    o.state_store = table.has_state_store = true;
    o.backend.spec = state_spec;
    auto fsync = txl::ParseFsyncPolicy(absl::GetFlag(FLAGS_fsync));
    if (!fsync.ok()) return absl::InvalidArgumentError(absl::StrCat("--fsync: ", fsync.status().message()));
    o.backend.fsync = *fsync;
    if (absl::GetFlag(FLAGS_fsync_interval_ms) < 1)
      return absl::InvalidArgumentError("--fsync_interval_ms must be >= 1");
    o.backend.fsync_interval = absl::Milliseconds(absl::GetFlag(FLAGS_fsync_interval_ms));
    std::string replica = absl::GetFlag(FLAGS_replica_name);
    if (replica.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      replica = host;
    }
    o.backend.writer = o.journal.replica = replica;
    if (absl::GetFlag(FLAGS_holder_timeout) <= 0) return absl::InvalidArgumentError("--holder_timeout must be > 0");
    o.journal.holder_timeout = absl::Seconds(absl::GetFlag(FLAGS_holder_timeout));
    o.journal.heartbeat_interval = o.journal.holder_timeout / 4;
  }

  txl::SchedulerConfig& sched = o.scheduler;
  sched.max_batch = absl::GetFlag(FLAGS_max_batch);
  sched.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  sched.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  sched.max_queue = absl::GetFlag(FLAGS_max_queue);
  if (sched.max_batch < 1 || sched.max_batch_tokens < 1 || sched.prefill_chunk < 1 || sched.max_queue < 1) {
    return absl::InvalidArgumentError("--max_batch, --max_batch_tokens, --prefill_chunk and --max_queue must be >= 1");
  }
  sched.snapshot_tokens = absl::GetFlag(FLAGS_snapshot_tokens);
  if (sched.snapshot_tokens < 1) return absl::InvalidArgumentError("--snapshot_tokens must be >= 1");
  if (absl::GetFlag(FLAGS_stream_stall_timeout) <= 0)
    return absl::InvalidArgumentError("--stream_stall_timeout must be > 0");
  sched.stall_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_stall_timeout));

  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.metrics.max_sessions = table.max_sessions;
  o.metrics.max_queue = sched.max_queue;
  o.metrics.session_memory_budget = table.memory_budget_bytes;

  o.grpc_memory_quota = absl::GetFlag(FLAGS_grpc_memory_quota);
  o.grpc_max_threads = absl::GetFlag(FLAGS_grpc_max_threads);
  if (o.grpc_memory_quota < 0 || o.grpc_max_threads < 0)
    return absl::InvalidArgumentError("--grpc_memory_quota and --grpc_max_threads must be >= 0");
  if (absl::GetFlag(FLAGS_max_connection_idle) < 0)
    return absl::InvalidArgumentError("--max_connection_idle must be >= 0");
  o.max_connection_idle = absl::Seconds(absl::GetFlag(FLAGS_max_connection_idle));
  return o;
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
// session memory budget and its pool.
absl::Status FitToModel(txl::ModelEngine* engine, ServerOptions* o) {
  const txl::LanguageModel& model = engine->model();
  const txl::ModelConfig& mc = model.config();
  if (o->service.default_mem_len == 0) o->service.default_mem_len = std::max<int64_t>(1, mc.mem_len);
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
      const txl::HostBudgetConfig budget =
          txl::HostBudgetOf(o->table, host, o->host_headroom, window, o->service.default_mem_len);
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
      ASSIGN_OR_RETURN(o->table.memory_budget_bytes, txl::DefaultDeviceBudget(budget));
      std::cerr << "txl-server: session memory budget " << o->table.memory_budget_bytes << " bytes (" << model.device()
                << ": " << memory->free_bytes << " free of " << memory->total_bytes << ", less "
                << txl::DeviceHeadroom(budget) << " headroom)" << std::endl;
    }
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
void PrintStarted(const ServerOptions& o, const txl::LanguageModel& model, int port,
                  const txl::HttpServer* metrics_http, const txl::HttpServer* http, const std::string& transport,
                  const txl::BearerTokens* tokens) {
  const txl::ModelConfig& mc = model.config();
  std::cout << "txl-server: listening on " << BoundAddress(o.listen, port)
            << (metrics_http ? ", metrics on " + BoundAddress(o.metrics_listen, metrics_http->port()) : "")
            << "\ntxl-server: model " << o.model.path << " (n_layer " << mc.n_layer << ", d_model " << mc.d_model
            << ", " << mc.n_token << " tokens, default mem_len " << o.service.default_mem_len << ") on "
            << model.device() << "\ntxl-server: device " << model.device() << ", dtype " << o.service.dtype
            << ", kv_dtype " << o.service.kv_dtype << ", kernels " << model.KernelPath() << "\ntxl-server: http "
            << (http ? "on " + BoundAddress(o.http.listen, http->port()) : std::string("off"))
            << "\ntxl-server: " << transport << ", "
            << (tokens ? absl::StrCat(tokens->size(), " bearer token(s) from ", o.auth_tokens)
                       : std::string("no authentication"))
            << std::endl;
}

// After SIGTERM/SIGINT: refuse new work, let what runs finish within
// --drain_timeout, cancel the rest, and leave snapshots behind.
void DrainAndStop(const ServerOptions& o, int sig, txl::Scheduler* scheduler, grpc::Server* server,
                  txl::OpenAiGateway* gateway, txl::HttpServer* http) {
  // Refuse first, then say so: a client that sees NOT_SERVING (or this line) is never accepted after it.
  // The HTTP port keeps accepting for the whole drain, so that a probe on a new connection reads
  // /readyz's 503 "draining" rather than a refused connection (new work there gets 503 too).
  scheduler->Drain();
  server->GetHealthCheckService()->SetServingStatus(false);
  if (http) gateway->SetDraining();
  std::cout << "txl-server: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining" << std::endl;
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

int Serve(ServerOptions o, sigset_t signals) {
  // Security first: a mistake there should not wait for the model to load.
  std::string transport;
  auto credentials = ServerCredentials(o.tls_cert, o.tls_key, o.tls_client_ca, &transport, &o.http);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  auto tokens = LoadTokens(o);
  if (!tokens.ok()) return Fail(std::string(tokens.status().message()));

  auto engine = txl::ModelEngine::Create(o.model);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  if (absl::Status fit = FitToModel(engine->get(), &o); !fit.ok()) return Fail(std::string(fit.message()));
  const txl::LanguageModel& model = (*engine)->model();
  // A repository of one: the file's stem, version 1 (docs/OPERATIONS.md, "Model repository").
  auto served = std::make_shared<txl::ServedModel>(std::filesystem::path(o.model.path).stem().string(), 1,
                                                   *std::move(engine), model.config(), model.tokenizer());
  txl::ReleaseFreedMemory();  // the load's temporaries: --malloc_keep_bytes would keep them resident

  // The state store, before anything is served: a restart finds its sessions first.
  auto journal = OpenStateStore(o);
  if (!journal.ok()) return Fail(std::string(journal.status().message()));
  txl::SessionTable table(o.table);
  if (*journal) {
    auto recovered = txl::RecoverSessions(journal->get(), &table, txl::OnlyModel(served));
    if (!recovered.ok()) return Fail(absl::StrCat("state store: ", recovered.status().message()));
    std::cout << "txl-server: state store " << (*journal)->Describe() << " as replica " << (*journal)->replica() << ": "
              << *recovered << " session(s) recovered" << std::endl;
  }

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
  txl::TxlService service(o.service, served, &table, &scheduler, metrics->get(), tokens->get(), journal->get());
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
    gateway = std::make_unique<txl::OpenAiGateway>(txl::OpenAiGatewayConfig{served->name(), o.chat_template},
                                                   service.core(), metrics->get());
    auto started = txl::HttpServer::Create(
        o.http, [g = gateway.get()](std::shared_ptr<txl::HttpExchange> x) { g->Handle(std::move(x)); });
    if (!started.ok()) return Fail(absl::StrCat("--http_listen: ", started.status().message()));
    http = *std::move(started);
  }
  scheduler.Start();
  server->GetHealthCheckService()->SetServingStatus(true);
  PrintStarted(o, model, port, metrics_http->get(), http.get(), transport, tokens->get());

  int sig = 0;
  sigwait(&signals, &sig);
  DrainAndStop(o, sig, &scheduler, server.get(), gateway.get(), http.get());
  std::cout << "txl-server: stopped" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage("txl-server [--model M.pt] [--listen HOST:PORT] [--device cpu|cuda] ...");
  absl::ParseCommandLine(argc, argv);
  // Before any thread starts: glibc gives threads arenas of their own, up to
  // 8 per core, and the engine thread's per-step allocations beside the
  // streams' left RSS growing in them (the soak: 6.6% in 40 s with the
  // default, 2.5% with one arena, the same tokens/s; docs/OPERATIONS.md).
  // And freed memory kept for reuse: a 2048-token bfloat16 prefill took
  // 690 ms with glibc's defaults, 575 ms with 256 MiB kept (OPTIMISATIONS
  // step 16).
  for (auto [name, value] : {std::pair<const char*, int64_t>{"--malloc_arenas", absl::GetFlag(FLAGS_malloc_arenas)},
                             {"--malloc_keep_bytes", absl::GetFlag(FLAGS_malloc_keep_bytes)}}) {
    if (value < 0) {
      std::cerr << "txl-server: " << name << " must be >= 0, got " << value << std::endl;
      return 2;
    }
  }
  if (absl::Status s = txl::TuneMalloc({absl::GetFlag(FLAGS_malloc_arenas), absl::GetFlag(FLAGS_malloc_keep_bytes)});
      !s.ok()) {
    std::cerr << "txl-server: warning: " << s.message() << std::endl;
  }
  // libgomp reads this once, when it loads, so only the launcher can set it.
  // Spinning workers made an engine step ~10x slower on busy shared cores
  // (docs/PERFORMANCE.md); the Dockerfile and scripts/run.sh set PASSIVE.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    std::cerr << "txl-server: OMP_WAIT_POLICY is not set; on shared or busy cores set "
                 "OMP_WAIT_POLICY=PASSIVE (docs/PERFORMANCE.md)"
              << std::endl;
  }
  // Signals go to the waiting thread in Serve, not to whichever thread runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto options = OptionsFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  return Serve(*std::move(options), signals);
}
