// SharedStateCache: entries one replica offers, another finds in the store;
// a scope keeps its newest entries only; damaged or foreign ones are never used.
#include "server/durability/shared_state_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/server/durability/journal_fixture.h"

namespace txl {
namespace {

std::unique_ptr<StateBackend> Backend(const std::string& dir, const std::string& writer) {
  StateBackendConfig config;
  config.spec = dir;
  config.writer = writer;
  auto backend = OpenStateBackend(config);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

CachedState State(int64_t position, const std::string& image, std::vector<int> pending = {}) {
  return {position, std::make_shared<const std::string>(image), std::move(pending)};
}

TEST(SharedStateCacheTest, AnEntryOneReplicaOffersAnotherFinds) {
  testing::ScopedDir dir("shared_cache");
  SharedStateCache a(Backend(dir.path, "r1-cache"), SharedStateCacheConfig{});
  SharedStateCache b(Backend(dir.path, "r2-cache"), SharedStateCacheConfig{});
  const std::vector<int> tokens = {1, 2, 3, 4, 5, 6};
  a.Offer("alice", absl::MakeConstSpan(tokens).first(3), State(3, "three"), 8);
  a.Offer("alice", absl::MakeConstSpan(tokens).first(5), State(5, "five", {5}), 8);
  a.Flush();
  auto hit = b.Longest("alice", tokens);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 5);
  EXPECT_EQ(*hit->image, "five");
  EXPECT_EQ(hit->pending, std::vector<int>{5});
  // The whole request kept with nothing pending would leave nothing to feed: the next one.
  hit = b.Longest("alice", absl::MakeConstSpan(tokens).first(3));
  EXPECT_FALSE(hit.has_value());
  hit = b.Longest("alice", absl::MakeConstSpan(tokens).first(4));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 3);
  EXPECT_FALSE(b.Longest("bob", tokens).has_value());
  EXPECT_FALSE(b.Longest("alice", std::vector<int>{1, 2, 9, 4, 5, 6}).has_value());
}

TEST(SharedStateCacheTest, AScopeKeepsItsNewestEntriesAndDeletesTheRest) {
  testing::ScopedDir dir("shared_cache_keep");
  SharedStateCacheConfig config;
  config.per_scope = 2;
  SharedStateCache a(Backend(dir.path, "r1-cache"), config);
  const std::vector<int> tokens = {1, 2, 3, 4, 5, 6};
  for (int64_t n : {2, 3, 4}) a.Offer("alice", absl::MakeConstSpan(tokens).first(n), State(n, "s"), 8);
  a.Flush();
  auto store = Backend(dir.path, "reader");
  auto keys = store->List("statecache/");
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 3u) << "two entries and the index";
  auto named = [&](const std::string& suffix) {
    return std::count_if(keys->begin(), keys->end(), [&](const std::string& k) { return absl::EndsWith(k, suffix); });
  };
  EXPECT_EQ(named("-2"), 0);
  EXPECT_EQ(named("-3"), 1);
  EXPECT_EQ(named("-4"), 1);
  EXPECT_EQ(named("/index"), 1);
  // 2 went (the oldest), and 3 would leave nothing to feed.
  EXPECT_FALSE(a.Longest("alice", absl::MakeConstSpan(tokens).first(3)).has_value());
  auto hit = a.Longest("alice", tokens);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 4);
}

TEST(SharedStateCacheTest, EntriesRoundTripAndDamageIsDataLoss) {
  SharedEntry e;
  e.scope = "alice\nmodel\n64";
  e.check = {3, 4};
  e.state = State(4, std::string("\0image\xff", 7), {4});
  const std::string bytes = EncodeSharedEntry(e);
  auto back = DecodeSharedEntry(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->scope, e.scope);
  EXPECT_EQ(back->check, e.check);
  EXPECT_EQ(back->state.position, 4);
  EXPECT_EQ(*back->state.image, *e.state.image);
  EXPECT_EQ(back->state.pending, e.state.pending);
  for (size_t at : {size_t{0}, size_t{12}, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[at] ^= 1;
    EXPECT_EQ(DecodeSharedEntry(bad).status().code(), absl::StatusCode::kDataLoss) << at;
  }
  EXPECT_EQ(DecodeSharedEntry(bytes.substr(0, 20)).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace txl
