// ImageBuffers: empty strings for turn checkpoints' images (CheckpointStore)
// whose pages a thread of their own has already touched. A checkpoint is a
// copy of a session's memory taken on the engine thread at the end of a
// turn; into fresh heap pages it costs the page faults too, about 8x the
// copy (5 ms against 0.6 ms for 8.4 MB), and every other session's next
// step waits for it (docs/SESSIONS.md, "Turn checkpoints").
//
// Threading: Take from any thread; the stock is refilled on the buffers'
// own thread, which the destructor stops.
#ifndef TXL_SERVER_SESSIONS_IMAGE_BUFFERS_H_
#define TXL_SERVER_SESSIONS_IMAGE_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace txl {

struct ImageBuffersConfig {
  int stock = 4;                          // buffers kept ready (turns that end together)
  int64_t max_bytes = int64_t{64} << 20;  // bound on the stock's bytes (fewer buffers when images are large)
};

class ImageBuffers {
 public:
  static absl::StatusOr<std::unique_ptr<ImageBuffers>> Create(const ImageBuffersConfig& config);
  ~ImageBuffers();
  ImageBuffers(const ImageBuffers&) = delete;
  ImageBuffers& operator=(const ImageBuffers&) = delete;

  // An empty string with room for `bytes`: a stocked one, its pages touched,
  // when one of about that size (at most a quarter more) is ready; otherwise
  // a string with nothing reserved (its writer faults the pages in, as
  // without a stock). Stocks up to the size asked for last.
  std::string Take(int64_t bytes);

  // Tests: waits until `count` buffers of at least `bytes` are ready.
  bool AwaitStock(int count, int64_t bytes, absl::Duration timeout);
  int ready() const;

 private:
  explicit ImageBuffers(const ImageBuffersConfig& config) : config_(config) {}
  void Loop();
  int Target() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // buffers to keep at want_bytes_

  const ImageBuffersConfig config_;
  mutable absl::Mutex mu_;
  std::vector<std::string> ready_ ABSL_GUARDED_BY(mu_);
  int64_t want_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // the size asked for last (0: none yet)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_IMAGE_BUFFERS_H_
