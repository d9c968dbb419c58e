// JsonObjectGrammar and JsonSchemaGrammar (server/sampling/json_schema.h):
// the JSON texts each grammar takes and refuses, byte by byte, and the
// schemas refused, each naming the keyword and where it is.
#include "server/sampling/json_schema.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "server/sampling/grammar.h"

namespace txl {
namespace {

std::shared_ptr<const Grammar> Compiled(const std::string& schema) {
  absl::StatusOr<std::string> text = JsonSchemaGrammar(schema);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return nullptr;
  auto g = Grammar::Parse(*text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << *text;
  return g.ok() ? *g : nullptr;
}

bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarState s(g);
  return s.Advance(text) && s.Complete();
}

std::string Refusal(const std::string& schema) {
  absl::StatusOr<std::string> text = JsonSchemaGrammar(schema);
  EXPECT_FALSE(text.ok()) << schema;
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(text.status().message());
}

TEST(JsonSchemaTest, TheObjectGrammarTakesJsonObjectsAndNothingElse) {
  auto g = Grammar::Parse(JsonObjectGrammar());
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* yes : {"{}", "{ }", R"({"a":1})", R"({"a": [1, -2.5e3, "x\n\u00e9", true, null, {}]})",
                          "{\n\"k\": {\"n\": [ ]}\n}", R"({"quote \" and \\": 0})", "{\"\xc3\xa9\": 0.5}"}) {
    EXPECT_TRUE(Matches(*g, yes)) << yes;
  }
  for (const char* no : {"", "[1]", "1", R"("s")", R"({"a" 1})", R"({"a":01})", R"({"a":1,})", R"({a:1})",
                         "{\"a\":\"\x01\"}", R"({"a":"\x"})", "{  }", R"({"a":1} )", "{\"a\":\ttrue}", "{\"\xc3\": 0}",
                         "{\"\x80\": 0}", "{\"\xed\xa0\x80\": 0}", "{\"\xc0\xaf\": 0}"}) {
    EXPECT_FALSE(Matches(*g, no)) << no;
  }
}

TEST(JsonSchemaTest, PropertiesFollowTheirOrderTypesAndRequired) {
  auto g = Compiled(R"({
    "type": "object",
    "title": "a person",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 4},
      "age": {"type": "integer", "description": "years"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}
    },
    "required": ["name", "age"],
    "additionalProperties": false
  })");
  ASSERT_NE(g, nullptr);
  for (const char* yes : {R"({"name":"Al","age":3})", R"({"name": "Bob!", "age": -1, "tags": ["a","b"]})",
                          R"({"name":"x","age":0,"ok":null})", R"({"name":"x","age":0,"tags":[],"ok":false})"}) {
    EXPECT_TRUE(Matches(g, yes)) << yes;
  }
  for (const char* no : {R"({"age":3,"name":"Al"})",                       // out of order
                         R"({"name":"Al"})",                               // age required
                         R"({"name":"","age":3})",                         // minLength 1
                         R"({"name":"Alice","age":3})",                    // maxLength 4
                         R"({"name":"Al","age":3.5})",                     // an integer
                         R"({"name":"Al","age":3,"tags":["c"]})",          // enum
                         R"({"name":"Al","age":3,"tags":["a","b","a"]})",  // maxItems 2
                         R"({"name":"Al","age":3,"other":1})",             // only the properties named
                         R"({"name":"Al","age":3,"ok":"yes"})"}) {
    EXPECT_FALSE(Matches(g, no)) << no;
  }
}

TEST(JsonSchemaTest, OptionalPropertiesMayBeLeftOutAnywhere) {
  auto g = Compiled(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}}})");
  ASSERT_NE(g, nullptr);
  for (const char* yes : {"{}", R"({"a":1})", R"({"b":2})", R"({"c":3})", R"({"a":1,"c":3})", R"({"b":2,"c":3})",
                          R"({"a":1,"b":2,"c":3})"}) {
    EXPECT_TRUE(Matches(g, yes)) << yes;
  }
  for (const char* no : {R"({,"a":1})", R"({"a":1,})", R"({"c":3,"a":1})", R"({"a":2})"}) {
    EXPECT_FALSE(Matches(g, no)) << no;
  }
  // A required one in the middle: what comes before it stays optional.
  auto mid = Compiled(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
                          "required": ["b"]})");
  ASSERT_NE(mid, nullptr);
  for (const char* yes : {R"({"b":2})", R"({"a":1,"b":2})", R"({"b":2,"c":3})"}) EXPECT_TRUE(Matches(mid, yes)) << yes;
  for (const char* no : {"{}", R"({"a":1})", R"({"a":1,"c":3})"}) EXPECT_FALSE(Matches(mid, no)) << no;
}

TEST(JsonSchemaTest, ArraysStringsChoicesAndNesting) {
  auto g = Compiled(R"({"type": "array", "minItems": 2, "maxItems": 3,
                        "items": {"anyOf": [{"type": "number"}, {"type": "object",
                          "properties": {"k": {"type": "string"}}, "required": ["k"]}]}})");
  ASSERT_NE(g, nullptr);
  for (const char* yes : {"[1,2]", R"([1, {"k": "v"}, 2e-3])", R"([{"k":""},{"k":"\"q\""}])"}) {
    EXPECT_TRUE(Matches(g, yes)) << yes;
  }
  for (const char* no : {"[1]", "[1,2,3,4]", R"([1,{"j":"v"}])", "[1,true]", "[]"}) EXPECT_FALSE(Matches(g, no)) << no;
  // A map of values of one schema.
  auto map = Compiled(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  ASSERT_NE(map, nullptr);
  EXPECT_TRUE(Matches(map, R"({"x": 1, "y": -2})"));
  EXPECT_FALSE(Matches(map, R"({"x": "1"})"));
  // No type: any JSON value; true likewise.
  for (const char* any : {"{}", "true"}) {
    auto g2 = Compiled(any);
    ASSERT_NE(g2, nullptr);
    for (const char* yes : {"1", R"("s")", "[null]", R"({"a":{}})"}) EXPECT_TRUE(Matches(g2, yes)) << yes;
  }
  // The largest bounds compile within the grammar's limits.
  EXPECT_NE(Compiled(R"({"type": "string", "maxLength": 256})"), nullptr);
  EXPECT_NE(Compiled(R"({"type": "array", "minItems": 3, "maxItems": 256})"), nullptr);
}

// Found in review: escapes of surrogates, keywords beside enum and const
// left unchecked, bounds that together passed the grammar's rule limit, a
// bound beyond int64, and two blanks in an empty object of optional properties.
TEST(JsonSchemaTest, ReviewedCornersHoldToTheSchema) {
  auto strings = Compiled(R"({"type": "string", "minLength": 2})");
  ASSERT_NE(strings, nullptr);
  EXPECT_TRUE(Matches(strings, R"("\u00e9\uFFFD")"));
  EXPECT_FALSE(Matches(strings, R"("\udc00\u0041")")) << "a lone surrogate";
  EXPECT_FALSE(Matches(strings, R"("\ud83d\ude00")")) << "a pair: one character of JSON Schema's";
  EXPECT_EQ(Refusal(R"({"type": "string", "enum": ["ab", "abcdef"], "maxLength": 3})"),
            "the schema: 'maxLength' beside 'enum' is not supported (list only the values it allows)");
  EXPECT_EQ(Refusal(R"({"const": "a", "anyOf": [{"type": "integer"}]})"),
            "the schema: 'anyOf' beside 'const' is not supported (list only the values it allows)");
  auto ints = Compiled(R"({"type": "integer", "enum": [1.0, 2]})");
  ASSERT_NE(ints, nullptr);
  EXPECT_TRUE(Matches(ints, "1.0"));
  EXPECT_NE(Compiled(R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 256},
                         "b": {"type": "string", "maxLength": 256}, "c": {"type": "array", "maxItems": 256}}})"),
            nullptr);
  EXPECT_EQ(Refusal(R"({"type": "string", "maxLength": 18446744073709551615})"),
            "the schema: 'maxLength' above 256 is not supported, got 18446744073709551615");
  auto optional = Compiled(R"({"properties": {"a": {"const": 1}}})");
  ASSERT_NE(optional, nullptr);
  EXPECT_TRUE(Matches(optional, "{ }"));
  EXPECT_FALSE(Matches(optional, "{  }"));
  // Read with bounds before anything recurses over it.
  std::string deep = "1";
  for (int i = 0; i < 200; ++i) deep = "[" + deep + "]";
  EXPECT_EQ(Refusal(R"({"const": )" + deep + "}"), "the schema nests deeper than 128");
  std::string keys = R"({"examples": {)";
  for (int i = 0; i <= kMaxSchemaKeys; ++i) keys += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 0";
  EXPECT_EQ(Refusal(keys + "}}"), "the schema has more than 4096 keys");
  EXPECT_EQ(Refusal(std::string(70000, ' ') + "{}"), "the schema is 70002 bytes, more than the limit of 65536");
}

TEST(JsonSchemaTest, UnsupportedSchemasAreRefusedNamingTheKeywordAndWhere) {
  EXPECT_EQ(Refusal(R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}})"),
            "properties.age: 'minimum' is not supported");
  EXPECT_EQ(Refusal(R"({"type": "string", "pattern": "^a"})"), "the schema: 'pattern' is not supported");
  EXPECT_EQ(Refusal(R"({"type": "string", "format": "date"})"), "the schema: 'format' is not supported");
  EXPECT_EQ(Refusal(R"({"$ref": "#/$defs/x"})"), "the schema: '$ref' is not supported (write the schema inline)");
  EXPECT_EQ(Refusal(R"({"type": "array", "items": {"oneOf": [{}, {}]}})"), "items: 'oneOf' is not supported");
  EXPECT_EQ(Refusal(R"({"properties": {"a": {}}, "required": ["b"]})"),
            "the schema: 'required' names \"b\", which 'properties' does not define");
  EXPECT_EQ(Refusal(R"({"type": "string", "maxLength": 257})"),
            "the schema: 'maxLength' above 256 is not supported, got 257");
  EXPECT_EQ(Refusal(R"({"type": "string", "minLength": 3, "maxLength": 2})"),
            "the schema: 'maxLength' 2 is below 'minLength' 3");
  EXPECT_EQ(Refusal(R"({"type": "date"})"),
            "the schema: 'type' \"date\" is not one of array, boolean, integer, null, number, object, string");
  EXPECT_EQ(Refusal(R"({"type": "integer", "enum": [1, "two"]})"),
            "the schema: the value \"two\" is not of its 'type'");
  EXPECT_EQ(Refusal(R"({"type": "array", "items": [{}]})"),
            "the schema: 'items' as an array (a tuple) is not supported");
  EXPECT_EQ(Refusal("false"), "the schema: a schema of false accepts nothing");
  EXPECT_EQ(Refusal("[1]"), "the schema: a schema must be an object (or true)");
  EXPECT_NE(Refusal("{\"type\":").find("the schema is not JSON"), std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i <= kMaxSchemaDepth; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(Refusal(deep).find("nested deeper than 32"), std::string::npos);
}

}  // namespace
}  // namespace txl
