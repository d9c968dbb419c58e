#include "server/sessions/session_export.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/byte_io.h"
#include "base/hash.h"

namespace txl {
namespace {

constexpr char kMagic[8] = {'T', 'X', 'L', 'S', 'E', 'S', 'S', '\0'};

}  // namespace

std::string EncodeSessionExport(const SessionExport& e) {
  std::string out(kMagic, sizeof(kMagic));
  PutLE<uint32_t>(&out, SessionExport::kVersion);
  PutLE<uint32_t>(&out, static_cast<uint32_t>(e.fingerprint.size()));
  out += e.fingerprint;
  PutLE<uint32_t>(&out, static_cast<uint32_t>(e.model.size()));
  out += e.model;
  PutLE<int64_t>(&out, e.position);
  PutLE<uint32_t>(&out, static_cast<uint32_t>(e.pending.size()));
  for (int t : e.pending) PutLE<int32_t>(&out, t);
  PutLE<uint64_t>(&out, e.state.size());
  out += e.state;
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::StatusOr<SessionExport> DecodeSessionExport(const std::string& bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return absl::InvalidArgumentError("session export: not a txl session export");
  ByteReader r(bytes);
  std::string magic;
  r.Bytes(sizeof(kMagic), &magic);
  uint32_t version = 0;
  if (!r.Get(&version)) return absl::InvalidArgumentError("session export: truncated");
  if (version != 1 && version != SessionExport::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("session export: format version ", version,
                                                   " (this server reads 1 to ", SessionExport::kVersion, ")"));
  }
  SessionExport e;
  uint32_t fp_len = 0, model_len = 0, n_pending = 0;
  uint64_t state_len = 0, checksum = 0;
  const auto truncated = [] { return absl::InvalidArgumentError("session export: truncated"); };
  if (!r.Get(&fp_len) || !r.Bytes(fp_len, &e.fingerprint)) return truncated();
  if (version >= 2 && (!r.Get(&model_len) || !r.Bytes(model_len, &e.model))) return truncated();
  if (!r.Get(&e.position) || !r.Get(&n_pending)) return truncated();
  for (uint32_t i = 0; i < n_pending; ++i) {
    int32_t t = 0;
    if (!r.Get(&t)) return truncated();
    e.pending.push_back(t);
  }
  if (!r.Get(&state_len) || !r.Bytes(state_len, &e.state)) return truncated();
  const size_t body = r.at();
  if (!r.Get(&checksum)) return truncated();
  if (r.at() != bytes.size()) return absl::InvalidArgumentError("session export: trailing bytes");
  if (checksum != Hash64(bytes.data(), body))
    return absl::InvalidArgumentError("session export: checksum mismatch (the data is damaged)");
  if (e.position < 0 || e.pending.size() > 1)
    return absl::InvalidArgumentError("session export: inconsistent position or pending tokens");
  return e;
}

absl::StatusOr<int64_t> SessionExportPosition(const std::string& bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return absl::InvalidArgumentError("session export: not a txl session export");
  ByteReader r(bytes);
  std::string skip;
  uint32_t version = 0, fp_len = 0, model_len = 0;
  int64_t position = 0;
  const auto truncated = [] { return absl::InvalidArgumentError("session export: truncated"); };
  if (!r.Bytes(sizeof(kMagic), &skip) || !r.Get(&version) || !r.Get(&fp_len) || !r.Bytes(fp_len, &skip))
    return truncated();
  if (version != 1 && version != SessionExport::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("session export: format version ", version));
  }
  if (version >= 2 && (!r.Get(&model_len) || !r.Bytes(model_len, &skip))) return truncated();
  if (!r.Get(&position)) return truncated();
  return position;
}

}  // namespace txl
