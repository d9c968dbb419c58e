#include "server/sampling/text_stream.h"

#include <algorithm>

namespace txl {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence that starts with `lead`, 0 if it cannot lead.
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether s[i..i+n) is a valid sequence (continuations, no overlongs or surrogates).
bool ValidSequence(const std::string& s, size_t i, int n) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  for (int k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
  if (n >= 3) {
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b0 == 0xE0 && b1 < 0xA0) return false;
    if (b0 == 0xED && b1 > 0x9F) return false;
    if (b0 == 0xF0 && b1 < 0x90) return false;
    if (b0 == 0xF4 && b1 > 0x8F) return false;
  }
  return true;
}

}  // namespace

bool IsValidUtf8(const std::string& text) {
  Utf8Stream s;
  return s.Push(text) == text && s.Flush().empty();
}

std::string Utf8Stream::Push(const std::string& bytes) {
  partial_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < partial_.size()) {
    const int n = SequenceLength(static_cast<unsigned char>(partial_[i]));
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (i + n > partial_.size()) {
      // Incomplete: wait for more, unless what we have is already wrong.
      bool viable = true;
      for (size_t k = i + 1; k < partial_.size(); ++k)
        viable &= (static_cast<unsigned char>(partial_[k]) & 0xC0) == 0x80;
      if (viable) break;
      out += kReplacement;
      ++i;
      continue;
    }
    if (ValidSequence(partial_, i, n)) {
      out.append(partial_, i, n);
      i += n;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  partial_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out = partial_.empty() ? "" : kReplacement;
  partial_.clear();
  return out;
}

TextStream::Update TextStream::Push(const std::string& token_bytes) {
  held_ += utf8_.Push(token_bytes);
  Update u;
  // A completed stop sequence: release what precedes it, drop the rest.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    const size_t at = held_.find(s);
    if (at != std::string::npos) first = std::min(first, at);
  }
  if (first != std::string::npos) {
    u.text = held_.substr(0, first);
    u.stopped = true;
    held_.clear();
    return u;
  }
  // Hold back the longest suffix that could still grow into a stop sequence.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  u.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return u;
}

std::string TextStream::Finish() {
  std::string out = held_ + utf8_.Flush();
  held_.clear();
  return out;
}

}  // namespace txl
