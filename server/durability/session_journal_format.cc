// The SessionJournal's formats in the store: the session meta, and the log
// records (their encoding, parsing, replay onto a snapshot, and the cut a
// rewind makes). See session_journal.h for the layout of the keys.
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/byte_io.h"
#include "base/hash.h"
#include "base/status_macros.h"
#include "server/durability/session_journal.h"
#include "server/durability/session_journal_internal.h"

namespace txl {
namespace {

constexpr char kMetaMagic[8] = {'T', 'X', 'L', 'M', 'E', 'T', 'A', '1'};

}  // namespace

namespace session_journal_internal {

std::string EncodeLogRecord(int64_t start, const std::vector<int>& tokens) {
  std::string out;
  PutLE<uint32_t>(&out, static_cast<uint32_t>(tokens.size()));
  PutLE<int64_t>(&out, start);
  // The header's own checksum tells a damaged length (DATA_LOSS) from a
  // record a crash cut short (a torn tail, ignored).
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  for (int t : tokens) PutLE<int32_t>(&out, t);
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::Status ParseLog(const std::string& log, int64_t* start, std::vector<int>* history, size_t* valid_bytes) {
  constexpr size_t kHeader = 4 + 8 + 8;
  ByteReader r(log);
  if (valid_bytes) *valid_bytes = 0;
  *start = -1;
  history->clear();
  while (r.left() > 0) {
    const size_t begin = r.at();
    if (r.left() < kHeader) return absl::OkStatus();  // torn tail
    uint32_t n = 0;
    int64_t at = 0;
    uint64_t header_sum = 0;
    r.Get(&n);
    r.Get(&at);
    r.Get(&header_sum);
    if (header_sum != Hash64(log.data() + begin, 12))
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, ": its header fails its checksum"));
    if (r.left() < uint64_t{n} * 4 + 8) return absl::OkStatus();  // torn tail
    std::vector<int> tokens(n);
    for (uint32_t i = 0; i < n; ++i) {
      int32_t t = 0;
      r.Get(&t);
      tokens[i] = t;
    }
    const size_t body = r.at() - begin;
    uint64_t sum = 0;
    r.Get(&sum);
    if (sum != Hash64(log.data() + begin, body))
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, " fails its checksum"));
    // Damage that a checksum can miss (a log that was written that way):
    // a negative start, or one whose record would run past the int64 range.
    if (at < 0 || at > std::numeric_limits<int64_t>::max() - int64_t{n})
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, " starts at position ", at));
    if (*start < 0) *start = at;
    const int64_t have = *start + static_cast<int64_t>(history->size());
    if (at > have || at < *start) {
      return absl::DataLossError(
          absl::StrCat("log record at byte ", begin, " starts at position ", at, " but the history ends at ", have));
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (at + static_cast<int64_t>(i) >= have) history->push_back(tokens[i]);
    }
    if (valid_bytes) *valid_bytes = r.at();
  }
  return absl::OkStatus();
}

}  // namespace session_journal_internal

using session_journal_internal::EncodeLogRecord;
using session_journal_internal::ParseLog;

absl::Status ReplayJournalLog(const std::string& log, JournalRecord* record, size_t* valid_bytes) {
  int64_t start = 0;
  std::vector<int> history;
  RETURN_IF_ERROR(ParseLog(log, &start, &history, valid_bytes));
  record->tail.clear();
  record->earlier.clear();
  if (history.empty()) return absl::OkStatus();
  const int64_t snap = record->image.position;
  const int64_t end = start + static_cast<int64_t>(history.size());
  if (start > snap) {
    return absl::DataLossError(absl::StrCat("the log starts at position ", start, " but the snapshot ends at ", snap));
  }
  if (end < snap) return absl::OkStatus();  // older than the snapshot: nothing to replay, no usable history
  record->earlier.assign(history.begin(), history.begin() + (snap - start));
  record->tail.assign(history.begin() + (snap - start), history.end());
  return absl::OkStatus();
}

absl::StatusOr<std::string> TruncateJournalLog(const std::string& log, int64_t position) {
  int64_t start = 0;
  std::vector<int> history;
  RETURN_IF_ERROR(ParseLog(log, &start, &history, nullptr));
  if (history.empty() || position <= start) return std::string();
  const int64_t end = start + static_cast<int64_t>(history.size());
  if (position > end)
    return absl::OutOfRangeError(absl::StrCat("the log ends at position ", end, ", before ", position));
  history.resize(static_cast<size_t>(position - start));
  return EncodeLogRecord(start, history);
}

std::string EncodeSessionMeta(const SessionMeta& m) {
  std::string out(kMetaMagic, sizeof(kMetaMagic));
  PutString(&out, m.id);
  PutString(&out, m.owner);
  PutLE<int64_t>(&out, m.mem_len);
  PutLE<int64_t>(&out, absl::ToInt64Seconds(m.idle_ttl));
  PutLE<int64_t>(&out, absl::ToUnixNanos(m.created));
  // The model version rides as a label the server reserves, so that servers
  // from before model versions read the meta (and keep the label) as ever.
  std::map<std::string, std::string> labels = m.labels;
  if (!m.model.empty()) labels[kModelLabel] = m.model;
  PutLE<uint32_t>(&out, static_cast<uint32_t>(labels.size()));
  for (const auto& [k, v] : labels) {
    PutString(&out, k);
    PutString(&out, v);
  }
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::StatusOr<SessionMeta> DecodeSessionMeta(const std::string& bytes) {
  const auto damaged = [] { return absl::DataLossError("session meta: truncated or damaged"); };
  if (bytes.size() < sizeof(kMetaMagic) + 8 ||
      bytes.compare(0, sizeof(kMetaMagic), kMetaMagic, sizeof(kMetaMagic)) != 0)
    return damaged();
  ByteReader r(absl::string_view(bytes).substr(sizeof(kMetaMagic)));
  SessionMeta m;
  int64_t ttl = 0, created = 0;
  uint32_t n_labels = 0;
  if (!r.String(&m.id) || !r.String(&m.owner) || !r.Get(&m.mem_len) || !r.Get(&ttl) || !r.Get(&created) ||
      !r.Get(&n_labels))
    return damaged();
  for (uint32_t i = 0; i < n_labels; ++i) {
    std::string k, v;
    if (!r.String(&k) || !r.String(&v)) return damaged();
    m.labels[k] = v;
  }
  if (auto it = m.labels.find(kModelLabel); it != m.labels.end()) {
    m.model = std::move(it->second);
    m.labels.erase(it);
  }
  const size_t body = sizeof(kMetaMagic) + r.at();
  uint64_t sum = 0;
  if (!r.Get(&sum) || r.left() != 0 || sum != Hash64(bytes.data(), body)) return damaged();
  m.idle_ttl = absl::Seconds(ttl);
  m.created = absl::FromUnixNanos(created);
  return m;
}

}  // namespace txl
