// SessionMemory (session_memory.h): moves, copies, and its byte image (what
// ExportSession carries and ImportSession restores). The raw ring buffers are copied as they are (slot p % mem_len
// holds position p), so nothing is recomputed and a restored session is
// bit-identical to the original.
//
// Layout, little-endian: "TXLMEM1\0", then int64 n_layer, n_head, d_head,
// mem_len, position, length, capacity, element size; then for each layer the
// keys and the values as [n_head, capacity, d_head] elements: float32 (element
// size 4) or bfloat16 (2), as the session holds them. A pooled memory
// (slot_pool.h) writes the same image, its rows gathered in slot order.
#include "model/net/session_memory.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "model/net/huge_pages.h"

namespace txl {

SessionMemory::~SessionMemory() { ReleaseSlots(); }

SessionMemory::SessionMemory(SessionMemory&& other) noexcept
    : mem_len_(other.mem_len_),
      full_bytes_(other.full_bytes_),
      position_(other.position_),
      length_(other.length_),
      capacity_(other.capacity_),
      k_(std::move(other.k_)),
      v_(std::move(other.v_)),
      pool_(std::move(other.pool_)),
      slots_(std::move(other.slots_)) {
  other.pool_.reset();
  other.slots_.clear();
  other.capacity_ = 0;
}

SessionMemory& SessionMemory::operator=(SessionMemory&& other) noexcept {
  if (this == &other) return *this;
  ReleaseSlots();
  mem_len_ = other.mem_len_;
  full_bytes_ = other.full_bytes_;
  position_ = other.position_;
  length_ = other.length_;
  capacity_ = other.capacity_;
  k_ = std::move(other.k_);
  v_ = std::move(other.v_);
  pool_ = std::move(other.pool_);
  slots_ = std::move(other.slots_);
  other.pool_.reset();
  other.slots_.clear();
  other.capacity_ = 0;
  return *this;
}

void SessionMemory::ReleaseSlots() {
  if (pool_ && !slots_.empty()) pool_->Give(slots_);
  slots_.clear();
  pool_.reset();
}

int64_t SessionMemory::bytes() const {
  if (pool_) return 2 * static_cast<int64_t>(k_.size()) * static_cast<int64_t>(slots_.size()) * pool_->row_bytes();
  if (k_.empty() || !k_[0].defined()) return 0;
  const at::Tensor& t = k_[0];  // [H, capacity, dh]: what is allocated, not just what is held
  return 2 * static_cast<int64_t>(k_.size()) * capacity_ * t.size(0) * t.size(2) * t.element_size();
}

absl::StatusOr<std::unique_ptr<SessionState>> SessionMemory::Clone() const {
  try {
    return std::unique_ptr<SessionState>(new SessionMemory(Copy()));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("copying a session's memory failed: ", e.what_without_backtrace()));
  }
}

absl::Status SessionMemory::AppendTo(std::string* out) const {
  try {
    WriteImage(out);
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("copying a session's memory out failed: ", e.what_without_backtrace()));
  }
}

SessionMemory SessionMemory::Copy() const {
  SessionMemory copy(static_cast<int64_t>(k_.size()), mem_len_, full_bytes_);
  copy.position_ = position_;
  copy.length_ = length_;
  copy.capacity_ = capacity_;
  if (pool_) {  // rows of the same pool, copied layer by layer
    copy.pool_ = pool_;
    copy.slots_ = pool_->Take(static_cast<int64_t>(slots_.size()), SlotPool::Admitted::kNo);
    const at::Device device = pool_->keys(0).device();
    const auto lopt = at::TensorOptions().dtype(at::kLong);
    const at::Tensor from = at::tensor(slots_, lopt).to(device), to = at::tensor(copy.slots_, lopt).to(device);
    for (size_t l = 0; l < k_.size(); ++l) {
      for (at::Tensor* t : {&pool_->keys(l), &pool_->values(l)}) t->index_copy_(0, to, t->index_select(0, from));
    }
    return copy;
  }
  if (k_.empty() || !k_[0].defined()) return copy;
  const int64_t n = static_cast<int64_t>(k_.size());
  std::vector<at::Tensor> rings = NewRings(2 * n, k_[0].sizes().vec(), k_[0].options());
  for (int64_t l = 0; l < n; ++l) {
    copy.k_[l] = rings[2 * l].copy_(k_[l]);
    copy.v_[l] = rings[2 * l + 1].copy_(v_[l]);
  }
  return copy;
}

namespace {

constexpr char kMagic[8] = {'T', 'X', 'L', 'M', 'E', 'M', '1', '\0'};
constexpr int kFields = 8;

}  // namespace

void SessionMemory::WriteImage(std::string* out) const {
  const int64_t n_layer = static_cast<int64_t>(k_.size());
  const bool pooled = pool_ != nullptr && !slots_.empty();
  const bool has = capacity_ > 0 && n_layer > 0 && (pooled || k_[0].defined());
  const int64_t heads = !has ? 0 : pooled ? pool_->heads() : k_[0].size(0);
  const int64_t d_head = !has ? 0 : pooled ? pool_->d_head() : k_[0].size(2);
  const int64_t element = !has ? 4 : pooled ? pool_->keys(0).element_size() : k_[0].element_size();
  const int64_t fields[kFields] = {n_layer, heads, d_head, mem_len_, position_, length_, has ? capacity_ : 0, element};
  // One allocation for the whole image: appended layer by layer, a
  // growing string copied it over again (an 8 MB memory took 6-7 ms).
  const int64_t data = has ? 2 * n_layer * heads * capacity_ * d_head * element : 0;
  out->reserve(out->size() + sizeof(kMagic) + sizeof(fields) + static_cast<size_t>(data));
  out->append(kMagic, sizeof(kMagic));
  out->append(reinterpret_cast<const char*>(fields), sizeof(fields));
  if (!has) return;
  // A pooled memory's slots, gathered in ring order, in the rings' layout.
  const at::Tensor rows =
      pooled ? at::tensor(slots_, at::TensorOptions().dtype(at::kLong)).to(pool_->keys(0).device()) : at::Tensor();
  for (int64_t l = 0; l < n_layer; ++l) {
    for (const bool key : {true, false}) {
      const at::Tensor ring = !pooled
                                  ? (key ? k_[l] : v_[l])
                                  : (key ? pool_->keys(l) : pool_->values(l)).index_select(0, rows).permute({1, 0, 2});
      const at::Tensor host = ring.to(at::kCPU).contiguous();
      out->append(static_cast<const char*>(host.data_ptr()), host.numel() * host.element_size());
    }
  }
}

absl::StatusOr<SessionMemory> SessionMemory::Parse(const std::string& data, const ModelConfig& config,
                                                   const at::Device& device, at::ScalarType kv_type) {
  const size_t header = sizeof(kMagic) + kFields * sizeof(int64_t);
  if (data.size() < header || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0)
    return absl::InvalidArgumentError("session state: not a txl session memory image");
  int64_t f[kFields];
  std::memcpy(f, data.data() + sizeof(kMagic), sizeof(f));
  const int64_t n_layer = f[0], heads = f[1], d_head = f[2], mem_len = f[3], position = f[4], length = f[5],
                capacity = f[6], element = f[7];
  if (n_layer != config.n_layer || (capacity > 0 && (heads != config.n_head || d_head != config.d_head))) {
    return absl::InvalidArgumentError(absl::StrCat("session state: made by a model with n_layer ", n_layer, ", n_head ",
                                                   heads, ", d_head ", d_head, "; this one has ", config.n_layer, ", ",
                                                   config.n_head, ", ", config.d_head));
  }
  // No session gets near 2^62 positions; past it, a step's arithmetic could overflow.
  // A ring not wrapped yet holds position p in slot p, so it reaches the
  // position; a window of 1 holds nothing and never has a ring, at any position.
  constexpr int64_t kMaxPosition = int64_t{1} << 62;
  if ((element != 4 && element != 2) || mem_len < 1 || position < 0 || length < 0 || position > kMaxPosition ||
      mem_len > kMaxPosition || length > mem_len - 1 || length > position || capacity < 0 || capacity > mem_len ||
      (mem_len > 1 && capacity < mem_len && position > capacity) || (length > 0 && capacity == 0)) {
    return absl::InvalidArgumentError("session state: inconsistent header");
  }
  // The header is client data (ImportSession): sizes are computed with overflow checks.
  int64_t per_tensor = 0, floats = 0;
  uint64_t want = 0;
  if (__builtin_mul_overflow(heads, capacity, &per_tensor) || __builtin_mul_overflow(per_tensor, d_head, &per_tensor) ||
      __builtin_mul_overflow(per_tensor, 2 * n_layer, &floats) ||
      __builtin_mul_overflow(static_cast<uint64_t>(floats), static_cast<uint64_t>(element), &want) ||
      __builtin_add_overflow(want, static_cast<uint64_t>(header), &want)) {
    return absl::InvalidArgumentError("session state: inconsistent header (sizes out of range)");
  }
  if (data.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("session state: ", data.size(), " bytes where the header implies ", want));
  }
  SessionMemory m(n_layer, mem_len);
  m.position_ = position;
  m.length_ = length;
  m.capacity_ = capacity;
  if (capacity == 0) return m;
  const char* p = data.data() + header;
  // The image's type may differ from the server's (--kv_dtype): copied
  // through a host tensor of the image's type and converted.
  const at::ScalarType image_type = element == 4 ? at::kFloat : at::kBFloat16;
  const bool direct = device.is_cpu() && image_type == kv_type;
  std::vector<at::Tensor> rings =
      NewRings(2 * n_layer, {heads, capacity, d_head}, at::TensorOptions().dtype(kv_type).device(device));
  at::Tensor host = direct ? at::Tensor() : at::empty({heads, capacity, d_head}, image_type);
  for (int64_t l = 0; l < n_layer; ++l) {
    m.k_[l] = rings[2 * l];
    m.v_[l] = rings[2 * l + 1];
    for (at::Tensor* t : {&m.k_[l], &m.v_[l]}) {
      std::memcpy(direct ? t->data_ptr() : host.data_ptr(), p, per_tensor * element);
      p += per_tensor * element;
      if (!direct) t->copy_(host);
    }
  }
  return m;
}

}  // namespace txl
