// kite/src/runtime/grammar/json_schema.cpp — JSON Schema → GBNF (the subset in grammar.h).
//
// Every schema becomes a GBNF expression; objects, arrays and $ref targets get rules named after
// their path. Object properties come in schema order: with props p1..pn the rules
//   first_i ::= kv_i after_{i+1}            (| first_{i+1} when p_i is optional)
//   after_i ::= "," ws kv_i after_{i+1}     (| after_{i+1} when p_i is optional)
// allow exactly the in-order subsets that contain every required property, with commas right.
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "src/runtime/grammar/grammar.h"

namespace kite {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kBaseRules = R"(ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" json-hex4 )
json-hex4 ::= [0-9a-cA-Ce-fE-F] json-hex json-hex json-hex | [dD] [0-7] json-hex json-hex |
  [dD] [89abAB] json-hex json-hex "\\u" [dD] [c-fC-F] json-hex json-hex
json-hex ::= [0-9a-fA-F]
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-number ::= json-integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
)";

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {
      "title",    "description", "default",   "examples",   "format",  "$schema",          "$id",
      "$comment", "readOnly",    "writeOnly", "deprecated", "$anchor", "contentMediaType", "contentEncoding"};
  return k;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> k = {"type",      "properties", "required", "additionalProperties",
                                          "items",     "minItems",   "maxItems", "minLength",
                                          "maxLength", "enum",       "const",    "anyOf",
                                          "oneOf",     "$ref",       "$defs",    "definitions"};
  return k;
}

// A GBNF string literal matching exactly `text`.
std::string literal(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_text(const Json& v) {
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {
    for (const char* n : {"root", "ws", "json-char", "json-hex4", "json-hex", "json-string", "json-integer",
                          "json-number", "json-boolean", "json-null", "json-value", "json-object", "json-array"})
      used_.insert(n);
  }

  Result<std::string> run() {
    KITE_ASSIGN_OR_RETURN(const std::string expr, compile(root_, "#", "root", 0));
    std::string out = "root ::= " + expr + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out + kBaseRules;
  }

 private:
  std::string unique_name(const std::string& hint) {
    std::string base;
    for (char c : hint) base += (isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    if (base.size() > 60) base.resize(60);
    std::string name = base;
    for (int i = 2; used_.count(name); ++i) name = base + "-" + std::to_string(i);
    used_.insert(name);
    return name;
  }
  std::string add_rule(const std::string& hint, std::string body) {
    std::string name = unique_name(hint);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  static Error unsupported(const std::string& path, const std::string& what) {
    return make_error("JSON schema: ", what, " at ", path, " is not supported");
  }

  Result<uint32_t> count(const Json& s, const char* key, const std::string& path, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return make_error("JSON schema: ", path, "/", key, " must be a non-negative integer, got ", json_text(v));
    if (v.get<int64_t>() > GrammarLimits::kMaxRepeat)
      return make_error("JSON schema: ", path, "/", key, " = ", json_text(v), " is above the limit of ",
                        GrammarLimits::kMaxRepeat);
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  Result<std::string> compile(const Json& s, const std::string& path, const std::string& hint, int depth) {
    if (depth > GrammarLimits::kMaxNesting)
      return make_error("JSON schema: nested deeper than ", GrammarLimits::kMaxNesting, " at ", path);
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return make_error("JSON schema: the schema at ", path, " is false (nothing can match)");
    }
    if (!s.is_object()) return make_error("JSON schema: the schema at ", path, " must be an object or a boolean");
    std::vector<std::string> keys;  // the keywords that constrain (not annotations, not $defs)
    for (const auto& [k, v] : s.items()) {
      if (annotations().count(k) || k == "$defs" || k == "definitions") continue;
      if (!supported().count(k)) return unsupported(path + "/" + k, "keyword '" + k + "'");
      keys.push_back(k);
    }
    // `k` with nothing else that constrains (`type` is fine next to const/enum).
    auto alone = [&](const std::string& k, bool type_ok) -> Status {
      for (const auto& other : keys)
        if (other != k && !(type_ok && other == "type"))
          return unsupported(path + "/" + other, "'" + other + "' together with '" + k + "'");
      return ok_status();
    };
    if (s.contains("$ref")) {
      KITE_TRY(alone("$ref", false));
      return ref(s["$ref"], path, depth);
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      KITE_TRY(alone(k, false));
      const Json& list = s[k];
      if (!list.is_array() || list.empty())
        return make_error("JSON schema: ", path, "/", k, " must be a non-empty array");
      std::string expr = "(";
      for (size_t i = 0; i < list.size(); ++i) {
        KITE_ASSIGN_OR_RETURN(const std::string e, compile(list[i], path + "/" + k + "/" + std::to_string(i),
                                                           hint + "-" + std::to_string(i), depth + 1));
        expr += (i ? " | " : " ") + e;
      }
      return expr + " )";
    }
    if (s.contains("const")) {
      KITE_TRY(alone("const", true));
      return literal(json_text(s["const"]));
    }
    if (s.contains("enum")) {
      KITE_TRY(alone("enum", true));
      const Json& list = s["enum"];
      if (!list.is_array() || list.empty()) return make_error("JSON schema: ", path, "/enum must be a non-empty array");
      std::string expr = "(";
      for (size_t i = 0; i < list.size(); ++i) expr += (i ? " | " : " ") + literal(json_text(list[i]));
      return expr + " )";
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) return make_error("JSON schema: ", path, "/type must list type names");
          types.push_back(x.get<std::string>());
        }
      } else {
        return make_error("JSON schema: ", path, "/type must be a type name or a non-empty list of them");
      }
    } else {
      for (const auto& k : keys) {
        if (k == "properties" || k == "required" || k == "additionalProperties") types = {"object"};
        if (k == "items" || k == "minItems" || k == "maxItems") types = {"array"};
        if (k == "minLength" || k == "maxLength") types = {"string"};
      }
      if (types.empty()) return std::string("json-value");
    }
    std::string expr;
    for (const auto& t : types) {
      KITE_ASSIGN_OR_RETURN(const std::string e, typed(s, t, path, hint, depth));
      expr += (expr.empty() ? "" : " | ") + e;
    }
    return types.size() == 1 ? expr : "( " + expr + " )";
  }

  Result<std::string> typed(const Json& s, const std::string& t, const std::string& path, const std::string& hint,
                            int depth) {
    if (t == "object") return object(s, path, hint, depth);
    if (t == "array") return array(s, path, hint, depth);
    if (t == "string") {
      KITE_ASSIGN_OR_RETURN(const uint32_t lo, count(s, "minLength", path, 0));
      if (!s.contains("maxLength") && lo == 0) return std::string("json-string");
      if (!s.contains("maxLength")) return "\"\\\"\" json-char{" + std::to_string(lo) + ",} \"\\\"\"";
      KITE_ASSIGN_OR_RETURN(const uint32_t hi, count(s, "maxLength", path, 0));
      if (hi < lo) return make_error("JSON schema: ", path, ": maxLength ", hi, " is below minLength ", lo);
      return "\"\\\"\" json-char{" + std::to_string(lo) + "," + std::to_string(hi) + "} \"\\\"\"";
    }
    if (t == "number") return std::string("json-number");
    if (t == "integer") return std::string("json-integer");
    if (t == "boolean") return std::string("json-boolean");
    if (t == "null") return std::string("json-null");
    return make_error("JSON schema: unknown type '", t, "' at ", path, "/type");
  }

  Result<std::string> object(const Json& s, const std::string& path, const std::string& hint, int depth) {
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty())
        return unsupported(path + "/required", "'required' without 'properties'");
      if (!extra || (extra->is_boolean() && extra->get<bool>())) return std::string("json-object");
      if (extra->is_boolean()) return std::string("\"{\" ws \"}\"");
      KITE_ASSIGN_OR_RETURN(const std::string v,
                            compile(*extra, path + "/additionalProperties", hint + "-value", depth + 1));
      const std::string kv = "json-string ws \":\" ws " + v + " ws";
      return add_rule(hint, "\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\"");
    }
    if (extra && !(extra->is_boolean() && !extra->get<bool>()))
      return unsupported(path + "/additionalProperties",
                         "'additionalProperties' other than false next to 'properties'");
    const Json& props = s["properties"];
    if (!props.is_object()) return make_error("JSON schema: ", path, "/properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return make_error("JSON schema: ", path, "/required must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return make_error("JSON schema: ", path, "/required must list property names");
        if (!props.contains(r.get<std::string>()))
          return make_error("JSON schema: ", path, "/required names '", r.get<std::string>(),
                            "', which is not in 'properties'");
        required.insert(r.get<std::string>());
      }
    }
    const std::string name = unique_name(hint);
    std::vector<std::string> kv;
    std::vector<bool> req;
    for (const auto& [key, sub] : props.items()) {
      KITE_ASSIGN_OR_RETURN(const std::string v,
                            compile(sub, path + "/properties/" + key, name + "-" + key, depth + 1));
      kv.push_back(literal(json_text(Json(key))) + " ws \":\" ws " + v + " ws");
      req.push_back(required.count(key) > 0);
    }
    std::string first_next, after_next;  // first_{i+1}, after_{i+1} ("" past the end)
    for (size_t j = kv.size(); j-- > 0;) {
      const std::string sj = std::to_string(j);
      std::string after = "\",\" ws " + kv[j] + " " + after_next;
      if (!req[j]) after += " | " + (after_next.empty() ? std::string("\"\"") : after_next);
      std::string first = kv[j] + " " + after_next;
      if (!req[j]) first += " | " + (first_next.empty() ? std::string("\"\"") : first_next);
      after_next = add_rule(name + "-a" + sj, after);
      first_next = add_rule(name + "-f" + sj, first);
    }
    rules_.emplace_back(name, "\"{\" ws " + first_next + " \"}\"");
    return name;
  }

  Result<std::string> array(const Json& s, const std::string& path, const std::string& hint, int depth) {
    std::string item = "json-value";
    if (s.contains("items")) {
      if (s["items"].is_array()) return unsupported(path + "/items", "a list of 'items' (tuple form)");
      KITE_ASSIGN_OR_RETURN(item, compile(s["items"], path + "/items", hint + "-item", depth + 1));
    }
    KITE_ASSIGN_OR_RETURN(const uint32_t lo, count(s, "minItems", path, 0));
    const bool bounded = s.contains("maxItems");
    KITE_ASSIGN_OR_RETURN(const uint32_t hi, count(s, "maxItems", path, 0));
    if (bounded && hi < lo) return make_error("JSON schema: ", path, ": maxItems ", hi, " is below minItems ", lo);
    if (bounded && hi == 0) return std::string("\"[\" ws \"]\"");
    const std::string rest_count =
        "{" + std::to_string(lo == 0 ? 0 : lo - 1) + "," + (bounded ? std::to_string(hi - 1) : std::string()) + "}";
    const std::string list = item + " ws ( \",\" ws " + item + " ws )" + rest_count;
    return add_rule(hint, "\"[\" ws " + (lo == 0 ? "( " + list + " )?" : list) + " \"]\"");
  }

  Result<std::string> ref(const Json& r, const std::string& path, int depth) {
    if (!r.is_string()) return make_error("JSON schema: ", path, "/$ref must be a string");
    const std::string target = r.get<std::string>();
    auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#')
      return unsupported(path + "/$ref", "'$ref' to '" + target + "' (only references inside the document, '#...')");
    const Json* node = nullptr;
    try {
      const Json::json_pointer ptr(target.substr(1));
      if (root_.contains(ptr)) node = &root_.at(ptr);
    } catch (const nlohmann::json::exception& e) {
      return make_error("JSON schema: ", path, "/$ref '", target, "' is not a valid JSON pointer: ", e.what());
    }
    if (!node) return make_error("JSON schema: ", path, "/$ref '", target, "' points at nothing");
    const size_t slash = target.find_last_of('/');
    const std::string name =
        unique_name("ref-" + (slash == std::string::npos ? std::string("root") : target.substr(slash + 1)));
    refs_.emplace(target, name);
    const size_t at = rules_.size();
    rules_.emplace_back(name, "");
    KITE_ASSIGN_OR_RETURN(const std::string body, compile(*node, target, name + "-body", depth + 1));
    rules_[at].second = body;
    return name;
  }

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> used_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

Result<std::string> json_schema_to_gbnf(std::string_view schema_json) {
  if (schema_json.size() > GrammarLimits::kMaxTextBytes)
    return make_error("JSON schema is ", schema_json.size(), " bytes, more than the limit of ",
                      GrammarLimits::kMaxTextBytes);
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    return make_error("JSON schema is not valid JSON: ", e.what());
  }
  return SchemaCompiler(schema).run();
}

}  // namespace kite
