// Turn checkpoints (budget, eviction order, rewinds and forks) and the token
// history they are replayed with.
#include "server/sessions/checkpoint_store.h"

#include <gtest/gtest.h>

#include "server/sessions/token_history.h"

namespace txl {
namespace {

std::shared_ptr<const std::string> Image(size_t bytes) { return std::make_shared<const std::string>(bytes, 'x'); }

std::vector<int64_t> Positions(const CheckpointStore& store, const std::string& id) {
  std::vector<int64_t> out;
  for (const TurnCheckpoint& c : store.Of(id)) out.push_back(c.position);
  return out;
}

TEST(TokenHistoryTest, KeepsTheLastTokensByAbsolutePosition) {
  TokenHistory h;
  h.Append({1, 2, 3, 4}, 0);
  EXPECT_EQ(h.start(), 0);
  EXPECT_EQ(h.end(), 4);
  h.Append({5, 6}, 4);  // at most 4: 1 and 2 drop off
  EXPECT_EQ(h.start(), 2);
  EXPECT_EQ(h.Slice(2, 6), (std::vector<int>{3, 4, 5, 6}));
  EXPECT_TRUE(h.Covers(3, 5));
  EXPECT_FALSE(h.Covers(1, 5));
  EXPECT_TRUE(h.Slice(1, 5).empty());
  EXPECT_EQ(h.Prefix(4).end(), 4);
  h.Truncate(5);
  EXPECT_EQ(h.Slice(2, 5), (std::vector<int>{3, 4, 5}));
  h.Truncate(1);  // below what is held: it goes on from there
  EXPECT_EQ(h.start(), 1);
  EXPECT_EQ(h.end(), 1);
}

TEST(CheckpointStoreTest, TheBudgetEvictsTheLeastRecentlyUsedFirst) {
  CheckpointStore store({/*budget_bytes=*/300, /*per_session=*/8});
  store.Put("a", 10, Image(100), {});
  store.Put("b", 5, Image(100), {});
  store.Put("a", 20, Image(100), {});
  EXPECT_EQ(store.bytes(), 300);
  store.Touch("a", 10);               // now b@5 is the least recently used
  store.Put("c", 1, Image(100), {});  // over budget: b@5 goes
  EXPECT_TRUE(store.Of("b").empty());
  EXPECT_EQ(Positions(store, "a"), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(store.bytes(), 300);
  EXPECT_EQ(store.count(), 3);
  store.Put("a", 20, Image(50), {});  // replaces the image at that position
  EXPECT_EQ(store.bytes(), 250);
  store.Put("d", 1, Image(301), {});  // larger than the whole budget: not kept
  EXPECT_TRUE(store.Of("d").empty());
  EXPECT_FALSE(store.WouldKeep(301));
  EXPECT_FALSE(CheckpointStore({0, 8}).WouldKeep(1)) << "budget 0: no checkpoints";
}

TEST(CheckpointStoreTest, EachSessionKeepsAtMostItsShare) {
  CheckpointStore store({/*budget_bytes=*/1 << 20, /*per_session=*/2});
  store.Put("a", 1, Image(10), {});
  store.Put("a", 2, Image(10), {});
  store.Put("a", 3, Image(10), {});
  EXPECT_EQ(Positions(store, "a"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(store.bytes(), 20);
}

TEST(CheckpointStoreTest, RewindsDropLaterOnesAndForksShareEarlierOnes) {
  CheckpointStore store({1 << 20, 8});
  for (int64_t p : {4, 8, 12}) store.Put("a", p, Image(10), {});
  store.CopyUpTo("a", "fork", 8);
  EXPECT_EQ(Positions(store, "fork"), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(store.Of("fork")[1].image, store.Of("a")[1].image) << "shared, not copied";
  store.DropAfter("a", 7);
  EXPECT_EQ(Positions(store, "a"), (std::vector<int64_t>{4}));
  store.DropAfter("a", 0);
  EXPECT_TRUE(store.Of("a").empty());
  store.Drop("fork");
  EXPECT_EQ(store.count(), 0);
  EXPECT_EQ(store.bytes(), 0);
}

}  // namespace
}  // namespace txl
