#include "server/sessions/session_export.h"

#include <gtest/gtest.h>

#include "base/byte_io.h"
#include "base/hash.h"

namespace txl {
namespace {

SessionExport Sample() {
  SessionExport e;
  e.fingerprint = "0123456789abcdef";
  e.model = "alpha@3";
  e.position = 42;
  e.pending = {7};
  e.state = std::string("state bytes \0 with a zero", 25);
  return e;
}

TEST(SessionExportTest, RoundTrips) {
  auto back = DecodeSessionExport(EncodeSessionExport(Sample()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fingerprint, Sample().fingerprint);
  EXPECT_EQ(back->model, "alpha@3");
  EXPECT_EQ(back->position, 42);
  EXPECT_EQ(*SessionExportPosition(EncodeSessionExport(Sample())), 42);
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

// Snapshots written before the model's name was recorded (format version 1:
// no model field) still read, with no name.
TEST(SessionExportTest, AVersionOneExportStillReads) {
  const SessionExport e = Sample();
  std::string v1("TXLSESS\0", 8);
  PutLE<uint32_t>(&v1, 1);
  PutLE<uint32_t>(&v1, static_cast<uint32_t>(e.fingerprint.size()));
  v1 += e.fingerprint;
  PutLE<int64_t>(&v1, e.position);
  PutLE<uint32_t>(&v1, 1);
  PutLE<int32_t>(&v1, e.pending[0]);
  PutLE<uint64_t>(&v1, e.state.size());
  v1 += e.state;
  PutLE<uint64_t>(&v1, Hash64(v1.data(), v1.size()));
  auto back = DecodeSessionExport(v1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fingerprint, e.fingerprint);
  EXPECT_EQ(back->model, "");
  EXPECT_EQ(back->position, 42);
  EXPECT_EQ(back->pending, e.pending);
  EXPECT_EQ(back->state, e.state);
  EXPECT_EQ(*SessionExportPosition(v1), 42);
}

TEST(SessionExportTest, AnotherVersionIsNamed) {
  std::string bytes = EncodeSessionExport(Sample());
  bytes[8] = 9;  // the version field follows the 8-byte magic
  auto s = DecodeSessionExport(bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("format version 9 (this server reads 1 to 2)"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace txl
