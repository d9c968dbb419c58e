// StateCache: the longest kept prefix wins, only where its last tokens match,
// only in its own scope; the budget evicts least recently used first.
#include "server/sessions/state_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace txl {
namespace {

CachedState State(int64_t position, size_t bytes, std::vector<int> pending = {}) {
  return {position, std::make_shared<const std::string>(bytes, 'x'), std::move(pending)};
}

TEST(StateCacheTest, TheLongestKeptPrefixThatLeavesATokenToFeedWins) {
  StateCache cache(StateCacheConfig{1 << 20});
  const std::vector<int> a = {1, 2, 3, 4, 5, 6};
  cache.Put("alice", absl::MakeConstSpan(a).first(2), State(2, 100), 8);
  cache.Put("alice", absl::MakeConstSpan(a).first(4), State(4, 100), 8);
  auto hit = cache.Longest("alice", a);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 4);
  // All of the request kept, nothing pending: nothing would be left to feed, so the shorter one.
  hit = cache.Longest("alice", absl::MakeConstSpan(a).first(4));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 2);
  // With its last token pending, the whole request is a hit.
  cache.Put("alice", absl::MakeConstSpan(a).first(5), State(5, 100, {5}), 8);
  hit = cache.Longest("alice", absl::MakeConstSpan(a).first(5));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 5);
  EXPECT_EQ(hit->pending, std::vector<int>{5});
  // Another history: a miss.
  EXPECT_FALSE(cache.Longest("alice", std::vector<int>{9, 2, 3, 4}).has_value());
  EXPECT_EQ(cache.stats().entries, 3);
  // What the requests made of their lookups is counted apart.
  cache.Count(CacheLookup::kHit, 4);
  cache.Count(CacheLookup::kStoreHit, 2);
  cache.Count(CacheLookup::kMiss, 0);
  const StateCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.store_hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.tokens_saved, 6);
}

TEST(StateCacheTest, APrincipalNeverReadsAnothersEntries) {
  StateCache cache(StateCacheConfig{1 << 20});
  const std::vector<int> t = {7, 8, 9};
  cache.Put("alice\nmodel\n64", absl::MakeConstSpan(t).first(2), State(2, 10), 8);
  EXPECT_TRUE(cache.Longest("alice\nmodel\n64", t).has_value());
  EXPECT_FALSE(cache.Longest("bob\nmodel\n64", t).has_value());
  EXPECT_FALSE(cache.Longest("alice\nmodel\n32", t).has_value());  // another window
}

TEST(StateCacheTest, ABudgetEvictsTheLeastRecentlyUsedAndNeverKeepsWhatCannotFit) {
  StateCache cache(StateCacheConfig{1000});
  const std::vector<int> a = {1, 2, 3}, b = {4, 5, 6}, c = {7, 8, 9};
  cache.Put("p", absl::MakeConstSpan(a).first(2), State(2, 400), 8);
  cache.Put("p", absl::MakeConstSpan(b).first(2), State(2, 400), 8);
  ASSERT_TRUE(cache.Longest("p", a).has_value());  // a is used: b is now the oldest
  cache.Put("p", absl::MakeConstSpan(c).first(2), State(2, 400), 8);
  EXPECT_TRUE(cache.Longest("p", a).has_value());
  EXPECT_FALSE(cache.Longest("p", b).has_value());
  EXPECT_TRUE(cache.Longest("p", c).has_value());
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_LE(cache.stats().bytes, 1000);
  cache.Put("p", absl::MakeConstSpan(b).first(2), State(2, 2000), 8);  // bigger than the budget
  EXPECT_FALSE(cache.Longest("p", b).has_value());
  EXPECT_EQ(cache.stats().entries, 2);
  StateCache off(StateCacheConfig{0});
  off.Put("p", absl::MakeConstSpan(a).first(2), State(2, 1), 8);
  EXPECT_FALSE(off.Longest("p", a).has_value());
}

// A hit needs its last `check` tokens (the receptive field) to be the
// request's: an entry is never used for another history, even one whose
// hash chain were to collide.
TEST(StateCacheTest, AHitMatchesTheLastCheckedTokens) {
  StateCache cache(StateCacheConfig{1 << 20});
  const std::vector<int> t = {1, 2, 3, 4, 5};
  cache.Put("p", absl::MakeConstSpan(t).first(4), State(4, 10), 2);
  auto hit = cache.Longest("p", t);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->position, 4);
  EXPECT_FALSE(cache.Longest("p", std::vector<int>{1, 2, 3, 9, 5}).has_value());
}

}  // namespace
}  // namespace txl
