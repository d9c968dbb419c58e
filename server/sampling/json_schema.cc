#include "server/sampling/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "server/sampling/json_bounds.h"

namespace txl {

namespace {

using Json = nlohmann::ordered_json;  // keeps the properties' order

// Any JSON value; a schema's rules refer to these. A string's characters
// are whole UTF-8 sequences (no overlong forms or surrogates) or escapes of
// one character (\u escapes outside the surrogates: a pair would be one
// character of JSON Schema's length, two of this grammar's).
constexpr char kJsonRules[] = R"(ws ::= [ \n]?
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws (json-string ws ":" ws json-value (ws "," ws json-string ws ":" ws json-value)* ws)? "}"
json-array ::= "[" ws (json-value (ws "," ws json-value)* ws)? "]"
json-string ::= "\"" json-char* "\""
json-char ::= [\x20-\x21\x23-\x5b\x5d-\x7f] | json-utf8 | "\\" (["\\/bfnrt] | "u" json-bmp)
json-bmp ::= [0-9a-cA-CeEfF] json-hex json-hex json-hex | [dD] [0-7] json-hex json-hex
json-hex ::= [0-9a-fA-F]
json-utf8 ::= [\xc2-\xdf] json-tail | "\xe0" [\xa0-\xbf] json-tail | [\xe1-\xec\xee-\xef] json-tail json-tail | "\xed" [\x80-\x9f] json-tail | "\xf0" [\x90-\xbf] json-tail json-tail | [\xf1-\xf3] json-tail json-tail json-tail | "\xf4" [\x80-\x8f] json-tail json-tail
json-tail ::= [\x80-\xbf]
json-number ::= json-integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
json-integer ::= "-"? ("0" | [1-9] [0-9]*)
)";

// `text` as a grammar literal, byte for byte.
std::string Literal(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A JSON value's text, as a grammar literal (enum and const).
std::string ValueLiteral(const Json& v) { return Literal(v.dump()); }

const std::set<std::string>& Annotations() {
  static const auto* const kSet =
      new std::set<std::string>{"title",   "description", "$schema",  "$id",       "$comment", "examples",
                                "default", "deprecated",  "readOnly", "writeOnly", "strict"};
  return *kSet;
}

const std::set<std::string>& Keywords() {
  static const auto* const kSet =
      new std::set<std::string>{"type",      "properties", "required", "additionalProperties",
                                "items",     "minItems",   "maxItems", "minLength",
                                "maxLength", "enum",       "const",    "anyOf"};
  return *kSet;
}

bool OfType(const Json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || v.is_number_unsigned() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  return v.is_null();  // "null"
}

class SchemaCompiler {
 public:
  absl::StatusOr<std::string> Compile(const Json& schema) {
    ASSIGN_OR_RETURN(std::string root, Value(schema, "", 0));
    return absl::StrCat("root ::= ", root, "\n", rules_, kJsonRules);
  }

 private:
  static std::string Where(const std::string& path) { return path.empty() ? "the schema" : path; }
  static absl::Status Bad(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": ", what));
  }
  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }

  // A new rule; returns its name.
  std::string Rule(const std::string& body) {
    std::string name = absl::StrCat("s", ++rules_made_);
    absl::StrAppend(&rules_, name, " ::= ", body, "\n");
    return name;
  }

  // A bound of the schema: a whole number in [0, kMaxSchemaBound], or `none` when absent.
  static absl::StatusOr<int> Bound(const Json& s, const char* key, const std::string& path, int none) {
    auto it = s.find(key);
    if (it == s.end()) return none;
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
      return Bad(path, absl::StrCat("'", key, "' must be a whole number"));
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxSchemaBound)) {
      return Bad(path, absl::StrCat("'", key, "' above ", kMaxSchemaBound, " is not supported, got ", it->dump()));
    }
    const auto v = it->get<int64_t>();
    if (v < 0) return Bad(path, absl::StrCat("'", key, "' must be at least 0, got ", v));
    if (v > kMaxSchemaBound) {
      return Bad(path, absl::StrCat("'", key, "' above ", kMaxSchemaBound, " is not supported, got ", v));
    }
    return static_cast<int>(v);
  }

  // An expression for the texts `s` accepts.
  absl::StatusOr<std::string> Value(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return Bad(path, absl::StrCat("schemas nested deeper than ", kMaxSchemaDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Bad(path, "a schema of false accepts nothing");
    }
    if (!s.is_object()) return Bad(path, "a schema must be an object (or true)");
    for (const auto& [key, unused] : s.items()) {
      if (Keywords().count(key) == 0 && Annotations().count(key) == 0) {
        if (key == "$ref" || key == "$defs" || key == "definitions") {
          return Bad(path, absl::StrCat("'", key, "' is not supported (write the schema inline)"));
        }
        return Bad(path, absl::StrCat("'", key, "' is not supported"));
      }
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      const std::vector<Json> named = it->is_array() ? it->get<std::vector<Json>>() : std::vector<Json>{*it};
      for (const Json& t : named) {
        static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                     "integer", "boolean", "null"};
        if (!t.is_string() || kTypes.count(t.get<std::string>()) == 0) {
          return Bad(path, absl::StrCat("'type' ", t.dump(), " is not one of ", absl::StrJoin(kTypes, ", ")));
        }
        types.push_back(t.get<std::string>());
      }
      if (types.empty()) return Bad(path, "'type' is an empty array");
    }
    if (s.contains("const") || s.contains("enum")) {
      // Only `type` may narrow them: the values are written as they are.
      for (const auto& [key, unused] : s.items()) {
        if (key != "const" && key != "enum" && key != "type" && Annotations().count(key) == 0) {
          return Bad(path, absl::StrCat("'", key, "' beside '", s.contains("enum") ? "enum" : "const",
                                        "' is not supported (list only the values it allows)"));
        }
      }
      return Choices(s, types, path);
    }
    if (auto it = s.find("anyOf"); it != s.end()) {
      for (const auto& [key, unused] : s.items()) {
        if (key != "anyOf" && Annotations().count(key) == 0) {
          return Bad(path, absl::StrCat("'anyOf' beside '", key, "' is not supported (move it into each choice)"));
        }
      }
      if (!it->is_array() || it->empty()) return Bad(path, "'anyOf' must be a non-empty array of schemas");
      std::vector<std::string> alternatives;
      for (size_t i = 0; i < it->size(); ++i) {
        ASSIGN_OR_RETURN(std::string a, Value((*it)[i], absl::StrCat(Child(path, "anyOf"), "[", i, "]"), depth + 1));
        alternatives.push_back(a);
      }
      return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
    }
    if (types.empty()) {  // the type its keywords imply, or any value
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
        types = {"object"};
      } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        types = {"array"};
      } else if (s.contains("minLength") || s.contains("maxLength")) {
        types = {"string"};
      } else {
        return std::string("json-value");
      }
    }
    std::vector<std::string> alternatives;
    for (const std::string& type : types) {
      ASSIGN_OR_RETURN(std::string a, Typed(s, type, path, depth));
      alternatives.push_back(a);
    }
    return alternatives.size() == 1 ? alternatives[0] : absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
  }

  absl::StatusOr<std::string> Choices(const Json& s, const std::vector<std::string>& types, const std::string& path) {
    std::vector<Json> values;
    if (auto it = s.find("const"); it != s.end()) values.push_back(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (s.contains("const")) return Bad(path, "'const' beside 'enum' is not supported");
      if (!it->is_array() || it->empty()) return Bad(path, "'enum' must be a non-empty array");
      values = it->get<std::vector<Json>>();
    }
    std::vector<std::string> literals;
    for (const Json& v : values) {
      if (!types.empty() &&
          std::none_of(types.begin(), types.end(), [&](const std::string& t) { return OfType(v, t); })) {
        return Bad(path, absl::StrCat("the value ", v.dump(), " is not of its 'type'"));
      }
      literals.push_back(ValueLiteral(v));
    }
    return absl::StrCat("(", absl::StrJoin(literals, " | "), ")");
  }

  absl::StatusOr<std::string> Typed(const Json& s, const std::string& type, const std::string& path, int depth) {
    if (type == "string") return String(s, path);
    if (type == "number") return std::string("json-number");
    if (type == "integer") return std::string("json-integer");
    if (type == "boolean") return std::string("(\"true\" | \"false\")");
    if (type == "null") return std::string("\"null\"");
    if (type == "array") return Array(s, path, depth);
    return Object(s, path, depth);
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& path) {
    ASSIGN_OR_RETURN(const int least, Bound(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(const int most, Bound(s, "maxLength", path, -1));
    if (least == 0 && most < 0) return std::string("json-string");
    if (most >= 0 && most < least)
      return Bad(path, absl::StrCat("'maxLength' ", most, " is below 'minLength' ", least));
    std::string body = "\"\\\"\"";
    for (int i = 0; i < least; ++i) body += " json-char";
    if (most < 0) {
      body += " json-char*";
    } else if (most > least) {
      body += " " + UpTo(most - least, "json-char");  // one more character, most - least times at most
    }
    return Rule(body + " \"\\\"\"");
  }

  // Up to `n` (>= 1) more of `item`: nested rules, one a level (an empty
  // alternative ends each), since n optional items in a row would each
  // match the same text.
  std::string UpTo(int n, const std::string& item) {
    std::string rest;
    for (int i = 0; i < n; ++i) rest = Rule(absl::StrCat(item, rest.empty() ? "" : " " + rest, " |"));
    return rest;
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& path, int depth) {
    std::string item = "json-value";
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return Bad(path, "'items' as an array (a tuple) is not supported");
      ASSIGN_OR_RETURN(item, Value(*it, Child(path, "items"), depth + 1));
      item = Rule(item);
    }
    ASSIGN_OR_RETURN(const int least, Bound(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(const int most, Bound(s, "maxItems", path, -1));
    if (most >= 0 && most < least) return Bad(path, absl::StrCat("'maxItems' ", most, " is below 'minItems' ", least));
    if (most == 0) return std::string("(\"[\" ws \"]\")");
    const std::string next = absl::StrCat("ws \",\" ws ", item);
    // The first item, the further ones `least` asks for, then the optional ones.
    std::string items = item;
    for (int i = 1; i < least; ++i) absl::StrAppend(&items, " ", next);
    if (most < 0) {
      absl::StrAppend(&items, " (", next, ")*");
    } else if (most > std::max(least, 1)) {
      absl::StrAppend(&items, " ", UpTo(most - std::max(least, 1), Rule(next)));
    }
    const std::string body = least == 0 ? absl::StrCat("(", items, " ws)?") : absl::StrCat(items, " ws");
    return Rule(absl::StrCat("\"[\" ws ", body, " \"]\""));
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& path, int depth) {
    std::vector<std::string> names;
    std::vector<std::string> values;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return Bad(path, "'properties' must be an object");
      for (const auto& [name, schema] : it->items()) {
        ASSIGN_OR_RETURN(std::string v, Value(schema, Child(Child(path, "properties"), name), depth + 1));
        names.push_back(name);
        values.push_back(v);
      }
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return Bad(path, "'required' must be an array of property names");
      for (const Json& r : *it) {
        if (!r.is_string()) return Bad(path, "'required' must be an array of property names");
        if (std::find(names.begin(), names.end(), r.get<std::string>()) == names.end()) {
          return Bad(path, absl::StrCat("'required' names ", r.dump(), ", which 'properties' does not define"));
        }
        required.insert(r.get<std::string>());
      }
    }
    if (names.empty()) {
      auto it = s.find("additionalProperties");
      if (it == s.end() || (it->is_boolean() && it->get<bool>())) return std::string("json-object");
      if (it->is_boolean()) return std::string("(\"{\" ws \"}\")");
      ASSIGN_OR_RETURN(std::string v, Value(*it, Child(path, "additionalProperties"), depth + 1));
      const std::string pair = Rule(absl::StrCat("json-string ws \":\" ws ", v));
      return Rule(absl::StrCat("\"{\" ws (", pair, " (ws \",\" ws ", pair, ")* ws)? \"}\""));
    }
    // Backwards: after[k], the properties from k on once one was written
    // (each after a comma); first[k], from k on with none written yet.
    const size_t m = names.size();
    std::vector<std::string> after(m + 1), first(m + 1);
    bool all_optional = true;
    for (size_t k = m; k-- > 0;) {
      const std::string pair = Rule(absl::StrCat(Literal(Json(names[k]).dump()), " ws \":\" ws ", values[k]));
      const bool needed = required.count(names[k]) > 0;
      const std::string then = after[k + 1].empty() ? "" : " " + after[k + 1];
      const std::string comma = absl::StrCat("ws \",\" ws ", pair);
      after[k] = Rule(needed ? comma + then : absl::StrCat("(", comma, ")?", then));
      // first[k] never matches nothing: an object whose properties are all
      // optional is "{" ws (first[0] ws)? "}", so "{}" has one place for a blank.
      if (needed || first[k + 1].empty()) {
        first[k] = Rule(pair + then);
      } else {
        first[k] = Rule(absl::StrCat(pair, then, " | ", first[k + 1]));
      }
      all_optional = all_optional && !needed;
    }
    if (all_optional) return Rule(absl::StrCat("\"{\" ws (", first[0], " ws)? \"}\""));
    return Rule(absl::StrCat("\"{\" ws ", first[0], " ws \"}\""));
  }

  std::string rules_;
  int rules_made_ = 0;
};

}  // namespace

std::string JsonObjectGrammar() { return absl::StrCat("root ::= json-object\n", kJsonRules); }

absl::StatusOr<std::string> JsonSchemaGrammar(absl::string_view schema) {
  if (static_cast<int64_t>(schema.size()) > kMaxSchemaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schema is ", schema.size(), " bytes, more than the limit of ", kMaxSchemaBytes));
  }
  // Read with its nesting and keys counted: the copies and dumps below recurse.
  JsonBounds bounds;
  Json parsed;
  try {
    parsed = Json::parse(schema.begin(), schema.end(), [&](int depth, Json::parse_event_t event, Json&) {
      bounds.Count(depth, event == Json::parse_event_t::key);
      return true;
    });
  } catch (const std::length_error&) {
    return absl::InvalidArgumentError(bounds.why());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the schema is not JSON: ", e.what()));
  }
  return SchemaCompiler().Compile(parsed);
}

}  // namespace txl
