// txl-server: serves Transformer-XL checkpoints over gRPC and HTTP with
// stateful sessions. The flags live here and become ServerOptions in one
// place (OptionsFromFlags); Serve (serve.h) builds the parts from them.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/flags_help.h"
#include "base/malloc_tuning.h"
#include "base/status_macros.h"
#include "model/precision.h"
#include "server/engine/version_policy.h"
#include "server/serve.h"
#include "server/server_options.h"

#ifndef TXL_BUNDLED_MODEL
#define TXL_BUNDLED_MODEL "model/bundled/shakespeare_char.pt"
#endif

ABSL_FLAG(std::string, model, "",
          "checkpoint to serve (empty: the bundled model, beside an installed binary in ../model/, "
          "else in the source tree)");
ABSL_FLAG(std::string, model_repository, "",
          "instead of --model: a directory of models, DIR/NAME/VERSION/model.pt; requests name one by their "
          "model field (NAME or NAME@VERSION)");
ABSL_FLAG(std::string, version_policy, "latest",
          "which versions of each repository model are served: latest, latest:N or all");
ABSL_FLAG(double, repository_poll_seconds, 0,
          "rescan --model_repository this often, loading new versions and retiring removed ones (0: never; "
          "LoadModel and UnloadModel still work)");
ABSL_FLAG(int32_t, repository_load_nice, 19,
          "the repository's loads (polls, LoadModel) run this much nicer than the server, 19 at most, so that "
          "they give way to the engine's steps (0: the server's priority)");
ABSL_FLAG(int64_t, model_memory_budget, -1,
          "bytes the repository's loaded weights may hold together; a version that does not fit is refused with "
          "the figures. -1: twice what the versions loaded at start-up hold, or a quarter of the host's available "
          "memory (a GPU's free memory) when that is more; 0: no limit. What it leaves for versions loaded later "
          "is set aside from the default session memory budget");
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
          "decode steps (one token per session) and small multi-token passes (up to 2,048 padded tokens: "
          "scoring segments, prefill chunks) as CUDA graphs, captured once per bucket of sessions, tokens and "
          "keys and replayed: auto (on a GPU), on or off. On a CPU, 'on' needs --kernels generic, where the "
          "same padded passes run eagerly (for testing)");
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
ABSL_FLAG(int, max_n, 16,
          "most choices one request may ask for (n, best_of: each is a session for the call's length), in [1, 128]");
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

using txl::ServerOptions;

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

// Every flag into the config structs of the parts it sets: the one place
// flags are read.
absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions o;
  o.repository.dir = absl::GetFlag(FLAGS_model_repository);
  if (!o.repository.dir.empty() && !absl::GetFlag(FLAGS_model).empty())
    return absl::InvalidArgumentError("--model and --model_repository: give one of them");
  auto policy = txl::ParseVersionPolicy(absl::GetFlag(FLAGS_version_policy));
  if (!policy.ok()) return absl::InvalidArgumentError(absl::StrCat("--version_policy: ", policy.status().message()));
  o.repository.policy = *policy;
  o.model_memory_budget = absl::GetFlag(FLAGS_model_memory_budget);
  if (o.model_memory_budget < -1)
    return absl::InvalidArgumentError(
        "--model_memory_budget must be >= -1 (-1: sized at start-up, see --help; 0: no limit)");
  o.repository.memory_budget_bytes = std::max<int64_t>(0, o.model_memory_budget);  // -1: set once loaded
  const double poll = absl::GetFlag(FLAGS_repository_poll_seconds);
  if (!(poll >= 0) || poll > 86400)
    return absl::InvalidArgumentError(absl::StrCat("--repository_poll_seconds must be in [0, 86400], got ", poll));
  o.repository_poll = poll == 0 ? absl::InfiniteDuration() : absl::Seconds(poll);
  o.repository_load_nice = absl::GetFlag(FLAGS_repository_load_nice);
  if (o.repository_load_nice < 0 || o.repository_load_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--repository_load_nice must be in [0, 19], got ", o.repository_load_nice));
  }
  if (o.repository.dir.empty()) {
    o.model.path = absl::GetFlag(FLAGS_model).empty() ? BundledModel() : absl::GetFlag(FLAGS_model);
  }
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
  service.max_n = absl::GetFlag(FLAGS_max_n);
  if (service.max_n < 1 || service.max_n > 128) {
    return absl::InvalidArgumentError(absl::StrCat("--max_n must be in [1, 128], got ", service.max_n));
  }
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
  return txl::Serve(*std::move(options), signals);
}
