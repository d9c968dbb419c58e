// Little-endian fixed-size fields for the server's own binary formats
// (session exports, journal records): append with PutLE, read with
// ByteReader, which reports running out instead of reading past the end.
#ifndef TXL_BASE_BYTE_IO_H_
#define TXL_BASE_BYTE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace txl {

template <typename T>
void PutLE(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A length (uint32) and the bytes.
inline void PutString(std::string* out, absl::string_view s) {
  PutLE<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

class ByteReader {
 public:
  explicit ByteReader(absl::string_view data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(uint64_t n, std::string* out) {
    if (data_.size() - at_ < n) return false;
    out->assign(data_.data() + at_, n);
    at_ += n;
    return true;
  }
  bool String(std::string* out) {
    uint32_t n = 0;
    return Get(&n) && Bytes(n, out);
  }
  size_t at() const { return at_; }
  size_t left() const { return data_.size() - at_; }

 private:
  absl::string_view data_;
  size_t at_ = 0;
};

}  // namespace txl

#endif  // TXL_BASE_BYTE_IO_H_
