// WaitingConnections: the connections a full HTTP port may close to admit a
// new one, oldest first (issue 31).
#include "server/http/waiting_connections.h"

#include <gtest/gtest.h>

#include <vector>

namespace txl {
namespace {

TEST(WaitingConnectionsTest, EvictsTheOldestFirstAndNeverARemovedOne) {
  WaitingConnections waiting;
  std::vector<int> evicted;
  std::vector<WaitingConnections::Key> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(waiting.Add([&evicted, i](WaitingConnections::Key) { evicted.push_back(i); }));
  }
  waiting.Remove(keys[0]);  // its request went in flight
  EXPECT_EQ(waiting.size(), 3);
  EXPECT_TRUE(waiting.EvictOldest());
  EXPECT_EQ(evicted, std::vector<int>({1}));
  // Connection 1 waits again (a kept-alive connection after its answer): now the newest.
  waiting.Remove(keys[1]);  // taken already: ignored
  keys[1] = waiting.Add([&evicted](WaitingConnections::Key) { evicted.push_back(1); });
  EXPECT_TRUE(waiting.EvictOldest());
  EXPECT_TRUE(waiting.EvictOldest());
  EXPECT_TRUE(waiting.EvictOldest());
  EXPECT_EQ(evicted, std::vector<int>({1, 2, 3, 1}));
  EXPECT_FALSE(waiting.EvictOldest());  // every connection has a request in flight
  EXPECT_EQ(waiting.size(), 0);
}

TEST(WaitingConnectionsTest, TheEvictCallbackGetsItsKey) {
  WaitingConnections waiting;
  WaitingConnections::Key got = 0;
  const WaitingConnections::Key key = waiting.Add([&got](WaitingConnections::Key k) { got = k; });
  EXPECT_NE(key, 0u);
  EXPECT_TRUE(waiting.EvictOldest());
  EXPECT_EQ(got, key);
}

}  // namespace
}  // namespace txl
