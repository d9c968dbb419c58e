#include "server/sessions/session_export.h"

#include <gtest/gtest.h>

namespace txl {
namespace {

SessionExport Sample() {
  SessionExport e;
  e.fingerprint = "0123456789abcdef";
  e.position = 42;
  e.pending = {7};
  e.state = std::string("state bytes \0 with a zero", 25);
  return e;
}

TEST(SessionExportTest, RoundTrips) {
  auto back = DecodeSessionExport(EncodeSessionExport(Sample()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fingerprint, Sample().fingerprint);
  EXPECT_EQ(back->position, 42);
  EXPECT_EQ(back->pending, std::vector<int>{7});
  EXPECT_EQ(back->state, Sample().state);
}

TEST(SessionExportTest, EveryTruncationIsRefused) {
  const std::string bytes = EncodeSessionExport(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto cut = DecodeSessionExport(bytes.substr(0, n));
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
  EXPECT_FALSE(DecodeSessionExport(bytes + "x").ok());
}

TEST(SessionExportTest, EveryFlippedByteIsRefused) {
  const std::string bytes = EncodeSessionExport(Sample());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x10);
    EXPECT_FALSE(DecodeSessionExport(damaged).ok()) << i;
  }
}

TEST(SessionExportTest, AnotherVersionIsNamed) {
  std::string bytes = EncodeSessionExport(Sample());
  bytes[8] = 9;  // the version field follows the 8-byte magic
  auto s = DecodeSessionExport(bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("format version 9"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace txl
