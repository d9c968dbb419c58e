#include "server/session_export.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/hash.h"

namespace txl {
namespace {

constexpr char kMagic[8] = {'T', 'X', 'L', 'S', 'E', 'S', 'S', '\0'};

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads fixed-size fields off the front; false once the data runs out.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(uint64_t n, std::string* out) {
    if (data_.size() - at_ < n) return false;
    out->assign(data_, at_, n);
    at_ += n;
    return true;
  }
  size_t at() const { return at_; }

 private:
  const std::string& data_;
  size_t at_ = 0;
};

}  // namespace

std::string EncodeSessionExport(const SessionExport& e) {
  std::string out(kMagic, sizeof(kMagic));
  Put<uint32_t>(&out, SessionExport::kVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(e.fingerprint.size()));
  out += e.fingerprint;
  Put<int64_t>(&out, e.position);
  Put<uint32_t>(&out, static_cast<uint32_t>(e.pending.size()));
  for (int t : e.pending) Put<int32_t>(&out, t);
  Put<uint64_t>(&out, e.state.size());
  out += e.state;
  Put<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::StatusOr<SessionExport> DecodeSessionExport(const std::string& bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return absl::InvalidArgumentError("session export: not a txl session export");
  Reader r(bytes);
  std::string magic;
  r.Bytes(sizeof(kMagic), &magic);
  uint32_t version = 0;
  if (!r.Get(&version)) return absl::InvalidArgumentError("session export: truncated");
  if (version != SessionExport::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("session export: format version ", version,
                                                   " (this server reads ", SessionExport::kVersion, ")"));
  }
  SessionExport e;
  uint32_t fp_len = 0, n_pending = 0;
  uint64_t state_len = 0, checksum = 0;
  const auto truncated = [] { return absl::InvalidArgumentError("session export: truncated"); };
  if (!r.Get(&fp_len) || !r.Bytes(fp_len, &e.fingerprint) || !r.Get(&e.position) || !r.Get(&n_pending))
    return truncated();
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

}  // namespace txl
