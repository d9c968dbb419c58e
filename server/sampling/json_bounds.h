// JsonBounds: a schema's nesting and keys, counted as nlohmann's parser reads
// it (from its parse callback), so that one too deep or too wide is refused
// before anything recurses over it (dump(), copies) or inserts into an
// ordered object, whose insertion costs its keys so far.
#ifndef TXL_SERVER_SAMPLING_JSON_BOUNDS_H_
#define TXL_SERVER_SAMPLING_JSON_BOUNDS_H_

#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/sampling/json_schema.h"

namespace txl {

class JsonBounds {
 public:
  // One parse event at `depth`: throws std::length_error, with why(), past
  // kMaxSchemaNesting or kMaxSchemaKeys.
  void Count(int depth, bool is_key) {
    if (depth > kMaxSchemaNesting) {
      why_ = absl::StrCat("the schema nests deeper than ", kMaxSchemaNesting);
    } else if (is_key && ++keys_ > kMaxSchemaKeys) {
      why_ = absl::StrCat("the schema has more than ", kMaxSchemaKeys, " keys");
    }
    if (!why_.empty()) throw std::length_error(why_);
  }
  const std::string& why() const { return why_; }

 private:
  std::string why_;
  int keys_ = 0;
};

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_JSON_BOUNDS_H_
