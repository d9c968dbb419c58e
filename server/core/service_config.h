// The service's settings (server/main.cc fills them from flags).
#ifndef TXL_SERVER_CORE_SERVICE_CONFIG_H_
#define TXL_SERVER_CORE_SERVICE_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <string>

namespace txl {

struct ServiceConfig {
  int64_t default_mem_len = 256;
  // --default_mem_len 0: each model version's own mem_len (at most
  // max_mem_len) instead; default_mem_len is then the first model's.
  bool default_mem_len_from_model = false;
  int64_t max_mem_len = 4096;
  int max_new_tokens = 4096;  // per request
  int64_t max_input_tokens = 65536;
  int max_top_logprobs = 20;
  int max_n = 16;  // choices of one request (n, best_of)
  std::string model_path;
  std::string device;
  // The model's number formats, by name ("float32", "bfloat16", "int8"): the
  // api layer reports them without reaching into model/.
  std::string dtype = "float32";
  std::string kv_dtype = "float32";
  std::string cpu_family;                       // LanguageModel::CpuFamily
  int64_t max_import_bytes = int64_t{1} << 30;  // ImportSession's data, in all
  // Generate/Converse output a call may hold for a client that reads slower
  // than it is produced; past it the call's session waits (Scheduler::Pause).
  int64_t max_stream_buffer_bytes = 256 << 10;
};

// A new session's window on a version whose checkpoint says `model_mem_len`.
inline int64_t DefaultMemLenOf(const ServiceConfig& c, int64_t model_mem_len) {
  if (!c.default_mem_len_from_model) return c.default_mem_len;
  return std::clamp<int64_t>(model_mem_len, 1, c.max_mem_len);
}

}  // namespace txl

#endif  // TXL_SERVER_CORE_SERVICE_CONFIG_H_
