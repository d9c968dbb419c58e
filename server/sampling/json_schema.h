// JSON output as a grammar (grammar.h): any JSON object, or the JSON texts a
// JSON Schema accepts (OpenAI's response_format json_object and json_schema).
// The grammar is what holds the output; this only writes it
// (docs/API_GENERATION.md, "Constrained output: JSON").
//
// The schemas taken (anything else is refused, naming the keyword and where):
//   type          "object", "array", "string", "number", "integer",
//                 "boolean", "null", or an array of them
//   properties    written in their order; `required` ones always, the others
//                 when the model writes them (no other property is written,
//                 whatever additionalProperties says)
//   required, additionalProperties (true, false or a schema: see above;
//                 with no properties, a schema is the values' schema)
//   items, minItems, maxItems      (bounds at most kMaxBound)
//   minLength, maxLength           (characters; at most kMaxBound)
//   enum, const, anyOf             (any JSON values; alternatives)
//   title, description, $schema, $id, $comment, examples, default,
//   deprecated, readOnly, writeOnly, strict: annotations, ignored
// Whitespace is at most one space or newline between tokens, so that a
// model cannot spend its tokens on it.
#ifndef TXL_SERVER_SAMPLING_JSON_SCHEMA_H_
#define TXL_SERVER_SAMPLING_JSON_SCHEMA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

// The largest length or item bound a schema may set (each unit is a rule).
inline constexpr int kMaxSchemaBound = 256;
// Schemas nested deeper than this are refused.
inline constexpr int kMaxSchemaDepth = 32;
// Bounds on a schema's JSON text, checked as it is read (before anything
// recurses over it): bytes, nesting of JSON values, and object keys.
inline constexpr int64_t kMaxSchemaBytes = 64 << 10;
inline constexpr int kMaxSchemaNesting = 128;
inline constexpr int kMaxSchemaKeys = 4096;

// A grammar whose texts are the JSON objects.
std::string JsonObjectGrammar();

// A grammar whose texts are the JSON texts `schema` (JSON text) accepts;
// INVALID_ARGUMENT naming the problem and its place in the schema
// ("properties.age: 'minimum' is not supported").
absl::StatusOr<std::string> JsonSchemaGrammar(absl::string_view schema);

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_JSON_SCHEMA_H_
