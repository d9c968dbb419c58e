// WaitingConnections: the HTTP connections with no request in flight (idle
// between keep-alive requests, or still sending one), oldest first. When the
// connection bound is reached the transport closes the oldest of them to
// admit a new connection (HttpServer), so clients that hold connections
// without using them cannot lock others out. A connection whose request is in
// flight (a streaming completion, say) is never here. Thread-safe.
#ifndef TXL_SERVER_HTTP_WAITING_CONNECTIONS_H_
#define TXL_SERVER_HTTP_WAITING_CONNECTIONS_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace txl {

class WaitingConnections {
 public:
  using Key = uint64_t;  // never 0; a later Add gets a larger key
  // `evict` closes the connection; it gets its key and must not block (the
  // transport posts the close onto the connection's strand).
  using Evict = std::function<void(Key)>;

  // A connection starts to wait; its key, for Remove.
  Key Add(Evict evict);
  // It waits no more (its request is in flight, or it closed). An unknown
  // key (already taken by EvictOldest) is ignored.
  void Remove(Key key);
  // Takes the connection that has waited longest off the list and runs its
  // `evict` (outside the lock); false when none waits.
  bool EvictOldest();
  int64_t size() const;

 private:
  mutable absl::Mutex mu_;
  Key next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<Key, Evict> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_HTTP_WAITING_CONNECTIONS_H_
