// TextStream: turns a request's generated tokens into the text the client
// sees. Token bytes may split a UTF-8 character (byte-level models), so text
// is released only in whole characters (invalid bytes become U+FFFD: the
// wire carries valid UTF-8 only). Stop sequences are matched on this text;
// text that might be the start of a stop sequence is held back until it is
// known not to be, so the output never ends in half a stop sequence.
#ifndef TXL_SERVER_SAMPLING_TEXT_STREAM_H_
#define TXL_SERVER_SAMPLING_TEXT_STREAM_H_

#include <string>
#include <vector>

namespace txl {

bool IsValidUtf8(const std::string& text);

// Incremental UTF-8 validation. Not thread-safe.
class Utf8Stream {
 public:
  // Appends bytes; returns the newly completed, valid text.
  std::string Push(const std::string& bytes);
  // The rest, with an incomplete trailing sequence as U+FFFD.
  std::string Flush();

 private:
  std::string partial_;
};

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_sequences) : stops_(std::move(stop_sequences)) {}

  struct Update {
    std::string text;      // newly released text (may be empty)
    bool stopped = false;  // a stop sequence completed; nothing more follows
  };
  // Adds one token's bytes.
  Update Push(const std::string& token_bytes);
  // At the end of generation: everything still held back.
  std::string Finish();

 private:
  Utf8Stream utf8_;
  std::vector<std::string> stops_;
  std::string held_;  // decoded text not yet released
};

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_TEXT_STREAM_H_
