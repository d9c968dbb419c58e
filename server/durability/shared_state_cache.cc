#include "server/durability/shared_state_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/byte_io.h"
#include "base/hash.h"
#include "base/log.h"

namespace txl {
namespace {

constexpr char kMagic[8] = {'T', 'X', 'L', 'S', 'C', '1', '\0', '\0'};
constexpr char kPrefix[] = "statecache/";

std::string ScopeDir(const std::string& scope) {
  return absl::StrCat(kPrefix, absl::Hex(Hash64(scope.data(), scope.size()), absl::kZeroPad16), "/");
}

std::string EntryName(uint64_t chain, int64_t length) {
  return absl::StrCat(absl::Hex(chain, absl::kZeroPad16), "-", length);
}

void PutInts(std::string* out, const std::vector<int>& v) {
  PutLE<uint32_t>(out, static_cast<uint32_t>(v.size()));
  for (int t : v) PutLE<int32_t>(out, t);
}

bool GetInts(ByteReader& in, std::vector<int>* v) {
  uint32_t n = 0;
  if (!in.Get(&n) || n > in.left() / sizeof(int32_t)) return false;
  v->resize(n);
  for (int& t : *v) {
    int32_t x = 0;
    in.Get(&x);
    t = x;
  }
  return true;
}

// "CHAIN-LENGTH" back into its parts; false for anything else.
bool ParseName(absl::string_view name, uint64_t* chain, int64_t* length) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
  return parts.size() == 2 && parts[0].size() == 16 && absl::SimpleHexAtoi(parts[0], chain) &&
         absl::SimpleAtoi(parts[1], length) && *length > 0;
}

}  // namespace

std::string EncodeSharedEntry(const SharedEntry& entry) {
  std::string out(kMagic, sizeof(kMagic));
  PutString(&out, entry.scope);
  PutLE<int64_t>(&out, entry.state.position);
  PutInts(&out, entry.state.pending);
  PutInts(&out, entry.check);
  const std::string& image = entry.state.image ? *entry.state.image : std::string();
  PutLE<uint64_t>(&out, image.size());
  out += image;
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::StatusOr<SharedEntry> DecodeSharedEntry(const std::string& bytes) {
  auto damaged = [] { return absl::DataLossError("state cache entry: damaged"); };
  if (bytes.size() < sizeof(kMagic) + sizeof(uint64_t) || bytes.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)))
    return damaged();
  const size_t body = bytes.size() - sizeof(uint64_t);
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + body, sizeof(sum));
  if (sum != Hash64(bytes.data(), body)) return damaged();
  ByteReader in(absl::string_view(bytes.data(), body));
  std::string magic;
  SharedEntry e;
  uint64_t image_size = 0;
  auto image = std::make_shared<std::string>();
  if (!in.Bytes(sizeof(kMagic), &magic) || !in.String(&e.scope) || !in.Get(&e.state.position) ||
      !GetInts(in, &e.state.pending) || !GetInts(in, &e.check) || !in.Get(&image_size) ||
      !in.Bytes(image_size, image.get()) || in.left() != 0 || e.state.pending.size() > 1) {
    return damaged();
  }
  e.state.image = std::move(image);
  return e;
}

SharedStateCache::SharedStateCache(std::unique_ptr<StateBackend> backend, const SharedStateCacheConfig& config)
    : config_(config), backend_(std::move(backend)), thread_([this] { Run(); }) {}

SharedStateCache::~SharedStateCache() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void SharedStateCache::Offer(const std::string& scope, absl::Span<const int> tokens, const CachedState& state,
                             int64_t check) {
  if (!state.image || tokens.empty() || state.position != static_cast<int64_t>(tokens.size())) return;
  Offered o;
  o.scope = scope;
  o.chain = StateCache::Chain(scope, tokens).back();
  o.entry.scope = scope;
  const size_t keep = std::min(tokens.size(), static_cast<size_t>(std::max<int64_t>(check, 1)));
  o.entry.check.assign(tokens.end() - keep, tokens.end());
  o.entry.state = state;
  absl::MutexLock lock(&mu_);
  ++offered_;
  if (static_cast<int64_t>(queue_.size()) >= config_.max_queue) {
    ++written_;  // dropped: as good as written for Flush
    return;
  }
  queue_.push_back(std::move(o));
  cv_.SignalAll();
}

void SharedStateCache::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t want = offered_;
  while (written_ < want && !stop_) cv_.Wait(&mu_);
}

void SharedStateCache::Run() {
  while (true) {
    Offered o;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      o = std::move(queue_.front());
      queue_.pop_front();
    }
    Write(o);
    absl::MutexLock lock(&mu_);
    ++written_;
    cv_.SignalAll();
  }
}

void SharedStateCache::Write(const Offered& o) {
  const std::string dir = ScopeDir(o.scope);
  const std::string name = EntryName(o.chain, o.entry.state.position);
  absl::Status s = backend_->Put(dir + name, EncodeSharedEntry(o.entry));
  std::vector<std::string> names;
  if (s.ok()) {
    auto index = backend_->Get(dir + "index");
    if (index.ok()) {
      names = absl::StrSplit(*index, '\n', absl::SkipEmpty());
    } else if (!absl::IsNotFound(index.status())) {
      s = index.status();
    }
  }
  if (s.ok()) {
    names.erase(std::remove(names.begin(), names.end(), name), names.end());
    names.push_back(name);  // newest last
    const size_t keep = static_cast<size_t>(std::max<int64_t>(config_.per_scope, 1));
    std::vector<std::string> dropped;
    if (names.size() > keep) {
      dropped.assign(names.begin(), names.end() - keep);
      names.erase(names.begin(), names.end() - keep);
    }
    s = backend_->Put(dir + "index", absl::StrJoin(names, "\n"));
    for (const std::string& d : dropped) {
      if (s.ok()) s = backend_->Delete(dir + d);
    }
  }
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    if (!warned_) {
      warned_ = true;
      TXL_LOG(WARNING) << "state cache: the state store did not take an entry (" << s.message()
                       << "); replicas share fewer states until it does (logged once)";
    }
  }
}

std::optional<CachedState> SharedStateCache::Longest(const std::string& scope, absl::Span<const int> tokens) {
  const std::string dir = ScopeDir(scope);
  auto index = backend_->Get(dir + "index");
  if (!index.ok()) return std::nullopt;
  const std::vector<uint64_t> chain = StateCache::Chain(scope, tokens);
  std::vector<std::pair<int64_t, std::string>> along;  // the index's entries on this token path
  for (absl::string_view name : absl::StrSplit(*index, '\n', absl::SkipEmpty())) {
    uint64_t c = 0;
    int64_t length = 0;
    if (ParseName(name, &c, &length) && length <= static_cast<int64_t>(tokens.size()) && chain[length] == c)
      along.emplace_back(length, std::string(name));
  }
  std::sort(along.rbegin(), along.rend());              // longest first
  for (size_t i = 0; i < along.size() && i < 2; ++i) {  // the longest may leave nothing to feed
    const auto& [length, name] = along[i];
    auto bytes = backend_->Get(dir + name);
    if (!bytes.ok()) continue;
    auto entry = DecodeSharedEntry(*bytes);
    if (entry.ok() && entry->scope == scope && entry->state.position == length &&
        StateCache::Usable(tokens, length, entry->check, entry->state.pending.size()))
      return entry->state;
  }
  return std::nullopt;
}

}  // namespace txl
