// The recipe schema: located at run time, parsed once, checked with valijson; its errors
// are turned into messages at the places the user wrote the problems.
//
// valijson reports every failing node with its context ("<root>", "[batch]", "[micro]");
// each is walked back down the document and the schema and re-checked against its own
// subschema to say what is wrong and how to fix it. Every node with a problem gets one
// message (its first problem: a wrong type hides the range check that would follow from
// it); the caller reports them all together in file order (missing keys after everything
// else, --set after the file).

// GCC 12 reports a false -Wrestrict inside std::string when inlining valijson's string
// handling (GCC bug 105329); the pragma must precede <string> to cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>
#include <vector>
#include <yaml-cpp/yaml.h>

#include "ops/knobs.h"
#include "runner/recipe/document.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace runner::recipe_detail {

std::string type_phrase(const std::string& t) {
  if (t == "integer") return "an integer";
  if (t == "number") return "a number";
  if (t == "string") return "a string";
  if (t == "boolean") return "true or false";
  if (t == "object") return "a mapping (keys indented under it)";
  if (t == "array") return "a list";
  return t;
}

// How a value is shown in a message: the text as written where we have it.
std::string shown(const json& v, const NodeInfo& info) {
  if (v.is_null()) return "nothing";
  if (v.is_object()) return "a mapping";
  if (v.is_array()) return "a list";
  if (v.is_string()) return "'" + printable(v.get<std::string>()) + "'";
  if (!info.raw.empty()) return printable(info.raw);
  return format_json_scalar(v);
}

namespace {

// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions, so that
// 'n_haeds' is one edit from 'n_heads'.
int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// The candidate closest to `word` (case-insensitive), when close enough to be a typo.
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() > 64) return std::nullopt;
  std::optional<std::string> best;
  int best_d = 1 << 30;
  for (const std::string& c : candidates) {
    const int d = edit_distance(lower(word), lower(c));
    const int limit = std::max<int>(1, static_cast<int>(std::max(word.size(), c.size()) / 3));
    if (d <= limit && d < best_d) best = c, best_d = d;
  }
  return best;
}

// "'a'", "'a' or 'b'", "'a', 'b' or 'c'"
std::string quoted_or(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i)
    s += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + ("'" + words[i] + "'");
  return s;
}

// The words of an enum a mistyped value most likely meant. A word the value names as one of
// its parts wins over spelling: h100 is the h100-80gb, not the h200 one letter away, and a100
// is either a100. The schema's "x-aliases" maps other names (gpu) to a word.
std::vector<std::string> suggest_words(const std::string& value, const json& sub) {
  std::vector<std::string> options;
  for (const json& e : sub["enum"]) options.push_back(format_json_scalar(e));
  const std::string v = lower(value);
  if (sub.contains("x-aliases") && sub["x-aliases"].is_object() && sub["x-aliases"].contains(v))
    return {sub["x-aliases"][v].get<std::string>()};
  const auto parts = [](const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s + "-") {
      if (c == '-' || c == '_' || c == ' ' || c == '.') {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    return out;
  };
  for (const std::string& o : options)
    if (lower(o) == v) return {o};  // only the case differs
  std::vector<std::string> named;
  const std::vector<std::string> vparts = parts(v);
  for (const std::string& o : options) {
    const std::vector<std::string> oparts = parts(lower(o));
    if (oparts.size() > 1 && std::find(vparts.begin(), vparts.end(), oparts.front()) != vparts.end()) named.push_back(o);
  }
  if (!named.empty()) return named;
  if (auto best = closest(value, options)) return {*best};
  return {};
}

// ---------------------------------------------------------------------------------------
// The schema: located at run time, parsed once per path

struct SchemaStore {
  std::string path;
  json doc;
  valijson::Schema schema;
};

std::string find_schema_path() {
  namespace fs = std::filesystem;
  const std::string fix = "set RUNNER_SCHEMA=/path/to/recipe.schema.json, or reinstall runner (share/runner/schemas)";
  if (const std::string& env = ops::knobs().schema; !env.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(env, ec))
      throw UserError(SourceLoc{env}, "the recipe schema named by RUNNER_SCHEMA does not exist", fix);
    return env;
  }
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / ".." / "share" / "runner" / "schemas" / "recipe.schema.json");
#ifdef RUNNER_SOURCE_DIR
  candidates.push_back(fs::path(RUNNER_SOURCE_DIR) / "schemas" / "recipe.schema.json");
#endif
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
  throw UserError(SourceLoc{}, "cannot find the recipe schema (recipe.schema.json)", fix);
}

const SchemaStore& recipe_schema() {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<SchemaStore>> cache;
  const std::string path = find_schema_path();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(path); it != cache.end()) return *it->second;
  auto store = std::make_unique<SchemaStore>();
  store->path = path;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string fix = "restore schemas/recipe.schema.json from the repository, or point RUNNER_SCHEMA at a good copy";
  try {
    store->doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw UserError(SourceLoc{path}, "the recipe schema is not valid JSON (at byte " + std::to_string(e.byte) + ")", fix);
  }
  try {
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    valijson::adapters::NlohmannJsonAdapter adapter(store->doc);
    parser.populateSchema(adapter, store->schema);
  } catch (const std::exception&) {
    throw UserError(SourceLoc{path}, "the recipe schema is not a valid JSON Schema (draft 7)", fix);
  }
  const SchemaStore& ref = *store;
  cache.emplace(path, std::move(store));
  return ref;
}

// ---------------------------------------------------------------------------------------
// Turning valijson's errors into one message

bool type_matches(const json& v, const std::string& t) {
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "null") return v.is_null();
  return true;
}

// An example value for a fix: the schema's first example, else its default.
std::string example_of(const json& sub, const json& value) {
  if (sub.value("type", "") == "integer" && value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && std::fabs(d) < 1e15) {
      double lo = sub.contains("minimum") ? sub["minimum"].get<double>() : -1e15;
      return format_number(std::max(lo, static_cast<double>(std::llround(d))));
    }
  }
  // An empty string is no example (it would print "like "): the next source is tried instead.
  const auto usable = [](const json& v) { return !v.is_string() || !v.get<std::string>().empty(); };
  if (sub.contains("examples") && sub["examples"].is_array() && !sub["examples"].empty() && usable(sub["examples"][0]))
    return format_json_scalar(sub["examples"][0]);
  if (sub.contains("default") && usable(sub["default"]) && !sub["default"].is_array())
    return format_json_scalar(sub["default"]);
  if (sub.contains("enum") && sub["enum"].is_array() && !sub["enum"].empty()) return format_json_scalar(sub["enum"][0]);
  if (sub.contains("minimum")) return format_json_scalar(sub["minimum"]);
  const std::string t = sub.value("type", "");
  if (t == "string") return "some-text";
  if (t == "boolean") return "true";
  if (t == "array") return "[1, 2]";
  return "1";
}

std::vector<std::string> property_names(const json& sub) {
  std::vector<std::string> names;
  if (sub.contains("properties") && sub["properties"].is_object())
    for (auto it = sub["properties"].begin(); it != sub["properties"].end(); ++it) names.push_back(it.key());
  return names;
}

// Dotted paths of the schema objects that define a property named `key`.
void find_key_owners(const json& sub, const std::string& path, const std::string& key, std::vector<std::string>& out) {
  if (!sub.is_object() || !sub.contains("properties") || !sub["properties"].is_object()) return;
  for (auto it = sub["properties"].begin(); it != sub["properties"].end(); ++it) {
    if (it.key() == key && !path.empty()) out.push_back(path);
    find_key_owners(it.value(), child_path(path, it.key()), key, out);
  }
}

std::string placeholder(const json& sub) {
  const std::string t = sub.value("type", "");
  if (t == "integer") return "<int>";
  if (t == "number") return "<number>";
  if (t == "boolean") return "<true|false>";
  if (t == "array") return "[...]";
  return "<" + (t.empty() ? std::string("value") : t) + ">";
}

std::string last_key(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

void type_problem(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  const std::string t = sub.value("type", "");
  const NodeInfo& info = doc.info(path);
  Problem p;
  p.loc = doc.value_loc(path);
  p.from_set = info.from_set;
  p.path = path;
  if (v.is_null()) {
    if (t == "object") {
      p.what = path + " is empty";
      p.fix = sub.contains("required")
                  ? "indent its keys under it: " + join(sub["required"].get<std::vector<std::string>>(), ", ")
                  : "write " + last_key(path) + ": {} for all defaults, or indent its keys under it, or remove it";
    } else {
      p.what = path + " has no value";
      p.fix = "write a value after '" + last_key(path) + ": ' (like " + example_of(sub, v) + ")" +
              (sub.contains("default") ? ", or remove the line to use the default" : "; it is required and has no default");
    }
    out.push_back(p);
    return;
  }
  p.what = describe_path(path) + " must be " + type_phrase(t) + ", got " + shown(v, info);
  if (t == "integer") {
    p.fix = "write a whole number like " + example_of(sub, v);
  } else if (t == "number") {
    p.fix = "write a number like " + example_of(sub, v);
  } else if (t == "string") {
    p.fix = v.is_object() || v.is_array() ? "write a single value, e.g. " + last_key(path) + ": " + example_of(sub, v)
                                          : "put it in quotes: '" + printable(info.raw.empty() ? v.dump() : info.raw) + "'";
  } else if (t == "boolean") {
    p.fix = "write true or false";
    if (v.is_string()) {
      const std::string s = lower(v.get<std::string>());
      if (s == "yes" || s == "no" || s == "on" || s == "off" || s == "y" || s == "n")
        p.fix += " (YAML 1.2 reads '" + v.get<std::string>() + "' as text, not as a boolean)";
    }
  } else if (t == "object") {
    const auto names = property_names(sub);
    p.fix = "put its keys on the lines below '" + last_key(path) + ":', indented" +
            (names.empty() ? std::string() : " (keys: " + join(names, ", ") + ")");
  } else if (t == "array") {
    p.fix = "write a list like " + (sub.contains("examples") && !sub["examples"].empty() ? sub["examples"][0].dump() : "[1, 2]");
    std::string fixed = p.fix;
    for (size_t i = 0; i < fixed.size(); ++i)
      if (fixed[i] == ',' && i + 1 < fixed.size() && fixed[i + 1] != ' ') fixed.insert(i + 1, " ");
    p.fix = fixed;
  }
  out.push_back(p);
}

void range_problem(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  const double x = v.get<double>();
  const bool has_lo = sub.contains("minimum") || sub.contains("exclusiveMinimum");
  const bool has_hi = sub.contains("maximum") || sub.contains("exclusiveMaximum");
  const bool lo_ex = sub.contains("exclusiveMinimum"), hi_ex = sub.contains("exclusiveMaximum");
  const double lo = has_lo ? sub[lo_ex ? "exclusiveMinimum" : "minimum"].get<double>() : 0;
  const double hi = has_hi ? sub[hi_ex ? "exclusiveMaximum" : "maximum"].get<double>() : 0;
  const bool below = has_lo && (lo_ex ? !(x > lo) : !(x >= lo));
  const bool above = has_hi && (hi_ex ? !(x < hi) : !(x <= hi));
  if (!below && !above) return;
  const NodeInfo& info = doc.info(path);
  Problem p;
  p.loc = doc.value_loc(path);
  p.from_set = info.from_set;
  p.path = path;
  const std::string got = shown(v, info), ex = example_of(sub, v);
  const bool integer = sub.value("type", "") == "integer";
  if (has_lo && has_hi) {
    const std::string interval = std::string(lo_ex ? "(" : "[") + format_number(lo) + ", " + format_number(hi) + (hi_ex ? ")" : "]");
    p.what = path + " must be in " + interval + ", got " + got;
    p.fix = "pick a value from " + format_number(lo) + (lo_ex ? " (exclusive)" : "") + " to " + format_number(hi) +
            (hi_ex ? " (exclusive)" : "") + ", like " + ex;
  } else if (below) {
    p.what = path + " must be " + (lo_ex ? "> " : ">= ") + format_number(lo) + ", got " + got;
    if (lo_ex && lo == 0) p.fix = std::string("use a positive ") + (integer ? "whole number" : "number") + " like " + ex;
    else p.fix = std::string("use a ") + (integer ? "whole number" : "number") + (lo_ex ? " above " : " of at least ") +
                 format_number(lo) + ", like " + ex;
  } else {
    p.what = path + " must be " + (hi_ex ? "< " : "<= ") + format_number(hi) + ", got " + got;
    p.fix = std::string("use a ") + (integer ? "whole number" : "number") + (hi_ex ? " below " : " of at most ") +
            format_number(hi) + ", like " + ex;
  }
  out.push_back(p);
}

// Re-checks one node against its own subschema (not its children) and says what is wrong.
// Key `key` in the mapping at `path`, whose schema allows only `names`.
// The hint for another tool's name of one of our keys: where to write it, here.
std::string foreign_key_fix(const ForeignKey& f, const std::string& path) {
  const std::string ours(f.ours);
  const size_t dot = ours.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : ours.substr(0, dot), leaf = ours.substr(dot + 1);
  std::string fix = "that is " + std::string(f.tools) + "'s name; here it is " + ours + ": ";
  if (parent == path) fix += "write " + leaf + " instead";
  else fix += "write " + leaf + " under " + parent + ":";
  if (!f.note.empty()) fix += " (" + std::string(f.note) + ")";
  return fix;
}

Problem unknown_key_problem(const std::string& key, const std::string& path, const std::vector<std::string>& names,
                            const SourceLoc& loc, bool from_set) {
  Problem p;
  p.loc = loc;
  p.from_set = from_set;
  p.path = child_path(path, key);
  p.what = "unknown key '" + printable(key) + "' " + (path.empty() ? "at the top level" : "in " + path);
  std::vector<std::string> owners;
  find_key_owners(recipe_schema().doc, "", key, owners);
  // Another tool's name first: it knows the exact key, where a typo match would only guess
  // (nanoGPT's n_layer is model.n_layers even when written at the top level).
  if (const ForeignKey* f = foreign_key(key)) {
    p.fix = foreign_key_fix(*f, path);
    p.means = std::string(f->ours);
  } else if (auto best = closest(key, names)) {
    p.fix = "did you mean '" + *best + "'?";
    p.means = child_path(path, *best);
  } else if (!owners.empty()) {
    p.fix = "'" + key + "' belongs under " + owners[0] + ": move it there";
    p.means = child_path(owners[0], key);
  } else {
    p.fix = "allowed keys " + (path.empty() ? std::string("at the top level") : "in " + path) + ": " + join(names, ", ");
  }
  return p;
}

// The unknown keys of the mapping `n` (a yaml-cpp node, before conversion) and of the mappings
// under its known keys that the schema describes as mappings. Nothing else is entered: a
// value the schema does not open (a list, a scalar, an unknown key's value) is never walked,
// so YAML aliases in it are not expanded, and the walk is bounded by the schema's size.
void unknown_keys_in(const YAML::Node& n, const json& sub, const std::string& path, const std::string& file,
                     std::vector<Problem>& out) {
  if (!n.IsMap() || !sub.is_object()) return;
  const auto names = property_names(sub);
  const bool closed = sub.contains("additionalProperties") && sub["additionalProperties"] == false;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const YAML::Node k = it->first;
    // Keys that are not plain names are convert()'s to report, with their own message.
    if (!k.IsScalar() || k.Scalar().empty() || k.Scalar().find_first_of(".[]") != std::string::npos) continue;
    const std::string& key = k.Scalar();
    if (std::find(names.begin(), names.end(), key) != names.end()) {
      unknown_keys_in(it->second, sub["properties"][key], child_path(path, key), file, out);
    } else if (closed) {
      const SourceLoc loc{file, k.Mark().line >= 0 ? k.Mark().line + 1 : 0, k.Mark().column >= 0 ? k.Mark().column + 1 : 0};
      out.push_back(unknown_key_problem(key, path, names, loc, false));
    }
  }
}

// Each check below adds the problem it finds and says whether it found one (a node gets the
// first problem only: the others usually follow from it).
bool enum_problem(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  if (!sub.contains("enum") || !sub["enum"].is_array()) return false;
  bool found = false;
  std::vector<std::string> options;
  for (const json& e : sub["enum"]) {
    found = found || e == v;
    options.push_back(format_json_scalar(e));
  }
  if (found) return false;
  const NodeInfo& info = doc.info(path);
  Problem p;
  p.loc = doc.value_loc(path);
  p.from_set = info.from_set;
  p.path = path;
  p.what = path + " must be one of " + join(options, ", ") + ", got " + shown(v, info);
  const std::vector<std::string> best = v.is_string() ? suggest_words(v.get<std::string>(), sub) : std::vector<std::string>{};
  p.fix = best.empty() ? "pick one of those" : "did you mean " + quoted_or(best) + "?";
  out.push_back(p);
  return true;
}

bool string_problem(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  if (!v.is_string()) return false;
  const NodeInfo& info = doc.info(path);
  const std::string s = v.get<std::string>();
  const std::string hint = sub.value("x-hint", "");
  if (sub.contains("minLength") && s.size() < sub["minLength"].get<size_t>()) {
    out.push_back({0, doc.value_loc(path), info.from_set, path + " is empty", hint.empty() ? "write at least one character" : hint, path});
    return true;
  }
  if (!sub.contains("pattern")) return false;
  bool ok = true;
  try {
    ok = std::regex_search(s, std::regex(sub["pattern"].get<std::string>()));
  } catch (const std::regex_error&) {
  }
  if (ok) return false;
  out.push_back({0, doc.value_loc(path), info.from_set, path + " '" + printable(s) + "' is not allowed",
                 hint.empty() ? "it must match " + sub["pattern"].get<std::string>() : hint, path});
  return true;
}

bool repeated_item_problem(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  if (!v.is_array() || !sub.value("uniqueItems", false)) return false;
  for (size_t j = 1; j < v.size(); ++j)
    for (size_t i = 0; i < j; ++i)
      if (v[i] == v[j]) {
        const std::string ip = item_path(path, j);
        out.push_back({0, doc.value_loc(ip), doc.info(ip).from_set,
                       path + " lists " + shown(v[j], doc.info(ip)) + " twice", "remove the repeated entry", path});
        return true;
      }
  return false;
}

// An object's unknown keys (when closed) and every missing required key, each with its fix.
void object_problems(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  const auto names = property_names(sub);
  if (sub.contains("additionalProperties") && sub["additionalProperties"] == false) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (std::find(names.begin(), names.end(), it.key()) != names.end()) continue;
      const std::string cp = child_path(path, it.key());
      out.push_back(unknown_key_problem(it.key(), path, names, doc.key_loc(cp), doc.info(cp).from_set));
    }
  }
  if (!sub.contains("required") || !sub["required"].is_array()) return;
  for (const json& r : sub["required"]) {
    const std::string k = r.get<std::string>();
    if (v.contains(k)) continue;
    const json& ks = sub["properties"].contains(k) ? sub["properties"][k] : json::object();
    Problem p;
    p.rank = 1;
    p.loc = doc.key_loc(path);
    p.from_set = doc.info(path).from_set;
    p.path = child_path(path, k);
    p.what = describe_path(path) + " is missing required key '" + k + "'";
    if (ks.value("type", "") == "object") {
      const auto req = ks.contains("required") ? ks["required"].get<std::vector<std::string>>() : std::vector<std::string>{};
      p.fix = "add a " + k + ": section" + (req.empty() ? std::string() : " with " + join(req, ", ") + " indented under it");
    } else {
      p.fix = "add " + k + ": " + placeholder(ks) + " (e.g. " + k + ": " + example_of(ks, json()) + ")";
    }
    out.push_back(p);
  }
}

void diagnose_node(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  if (!sub.is_object()) return;
  if (sub.contains("type") && sub["type"].is_string() && !type_matches(v, sub["type"].get<std::string>())) {
    type_problem(v, sub, path, doc, out);
    return;
  }
  if (enum_problem(v, sub, path, doc, out)) return;
  if (v.is_number()) {
    const size_t before = out.size();
    range_problem(v, sub, path, doc, out);
    if (out.size() > before) return;
  }
  if (string_problem(v, sub, path, doc, out) || repeated_item_problem(v, sub, path, doc, out)) return;
  if (v.is_object()) object_problems(v, sub, path, doc, out);
}

}  // namespace

std::vector<Problem> unknown_key_problems(const YAML::Node& top, const std::string& file) {
  std::vector<Problem> found;
  unknown_keys_in(top, recipe_schema().doc, "", file, found);
  return found;
}

// Every problem of the document, one per node with a problem.
std::vector<Problem> schema_problems(const Doc& doc) {
  const SchemaStore& store = recipe_schema();
  valijson::ValidationResults results;
  bool ok = false;
  try {
    valijson::Validator validator(valijson::Validator::kStrongTypes);
    valijson::adapters::NlohmannJsonAdapter adapter(doc.root);
    ok = validator.validate(store.schema, adapter, &results);
  } catch (const std::exception&) {
    throw UserError(SourceLoc{doc.file}, "the recipe could not be checked against the schema " + store.path,
                    "check that the schema file is intact (RUNNER_SCHEMA overrides its location)");
  }
  if (ok) return {};

  std::vector<Problem> problems;
  std::set<std::vector<std::string>> seen;
  valijson::ValidationResults::Error err;
  std::optional<Problem> fallback;
  while (results.popError(err)) {
    if (!seen.insert(err.context).second) continue;
    // Walk the context ("<root>", "[batch]", "[micro]") down the document and the schema.
    const json* node = &doc.root;
    const json* sub = &store.doc;
    std::string path;
    bool walked = true;
    for (size_t i = 1; i < err.context.size() && walked; ++i) {
      std::string seg = err.context[i];
      if (seg.size() >= 2 && seg.front() == '[' && seg.back() == ']') seg = seg.substr(1, seg.size() - 2);
      if (node->is_object() && node->contains(seg)) {
        node = &(*node)[seg];
        path = child_path(path, seg);
        const json* props = sub->contains("properties") ? &(*sub)["properties"] : nullptr;
        sub = props && props->contains(seg) ? &(*props)[seg] : nullptr;
      } else if (node->is_array() && is_index(seg) && std::stoul(seg) < node->size()) {
        node = &(*node)[std::stoul(seg)];
        path = item_path(path, std::stoul(seg));
        sub = sub->contains("items") ? &(*sub)["items"] : nullptr;
      } else {
        walked = false;
      }
      if (!sub) walked = false;
    }
    if (!walked) continue;
    const size_t before = problems.size();
    diagnose_node(*node, *sub, path, doc, problems);
    if (problems.size() == before && !fallback && err.description.rfind("Failed to validate", 0) != 0)
      fallback = Problem{0, doc.value_loc(path), doc.info(path).from_set,
                         describe_path(path) + " is not valid: " + err.description,
                         "see its description in " + store.path, path};
  }
  if (problems.empty()) {
    if (fallback) return {*fallback};
    return {Problem{0, SourceLoc{doc.file}, false, "the recipe does not match the schema",
                    "compare it with recipes/quickstart.yaml and " + store.path, ""}};
  }
  return problems;
}

}  // namespace runner::recipe_detail
