#include "server/sampling/text_stream.h"

#include <gtest/gtest.h>

namespace txl {
namespace {

TEST(Utf8StreamTest, HoldsBackASplitCharacter) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("a\xC3"), "a");  // first byte of é
  EXPECT_EQ(s.Push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.Push("\xE4\xB8"), "");
  EXPECT_EQ(s.Push("\xAD!"), "\xE4\xB8\xAD!");
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacementCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("\xFF"
                   "a"),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(s.Push("\xC3"
                   "b"),
            "\xEF\xBF\xBD"
            "b");                                                             // a lead byte without its continuation
  EXPECT_EQ(s.Push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(s.Push("\xE4"), "");
  EXPECT_EQ(s.Flush(), "\xEF\xBF\xBD");
}

TEST(TextStreamTest, StopSequenceIsNeverCutIntoTheOutput) {
  TextStream t({"END"});
  std::string out;
  for (const char* piece : {"ab", "E", "N", "x"}) {
    auto u = t.Push(piece);
    out += u.text;
    EXPECT_FALSE(u.stopped);
  }
  EXPECT_EQ(out, "abENx");  // "EN" was held back until "x" ruled the stop out
  auto u = t.Push("yEN");
  EXPECT_EQ(u.text, "y");
  u = t.Push("D tail");
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.text, "");
}

TEST(TextStreamTest, FinishReleasesHeldText) {
  TextStream t({"stop"});
  EXPECT_EQ(t.Push("go st").text, "go ");
  EXPECT_EQ(t.Finish(), "st");
}

TEST(TextStreamTest, EarliestStopWins) {
  TextStream t({"cd", "b"});
  auto u = t.Push("abcd");
  EXPECT_TRUE(u.stopped);
  EXPECT_EQ(u.text, "a");
}

}  // namespace
}  // namespace txl
