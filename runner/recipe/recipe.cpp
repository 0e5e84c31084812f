// The recipe: reading, --set overrides, schema validation, typing, cross-field checks,
// and the resolved YAML written to the run directory.
//
// Design. yaml-cpp parses the text; the tree is then converted ONCE into a JSON value
// typed by the YAML 1.2 core schema (`8` is an integer, `'8'` a string, `yes` a string)
// while a side table remembers where every node was written. --set overrides edit that
// tree. valijson checks it against schemas/recipe.schema.json with strict types, and the
// contexts of its errors are walked back to the side table so that the FIRST problem is
// reported as file:line:col with a fix. Only then are the typed structs filled.
// (valijson's own yaml-cpp adapter is not used: it sees every scalar as a string and
// throws YAML::BadConversion while checking `micro: eight`, so types cannot be checked.)

// GCC 12 reports a false -Wrestrict inside std::string when inlining valijson's string
// handling (GCC bug 105329); the pragma must precede <string> to cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "runner/recipe/recipe.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

namespace runner {

int64_t ModelConfig::mlp_hidden() const { return std::llround(mlp_ratio * static_cast<double>(d_model)); }

SourceLoc Recipe::loc(const std::string& dotted_path) const {
  std::string p = dotted_path;
  while (!p.empty()) {
    if (auto it = locs.find(p); it != locs.end()) return it->second;
    const size_t cut = p.find_last_of(".[");
    if (cut == std::string::npos) break;
    p.resize(cut);
  }
  return SourceLoc{source_file, 0, 0};
}

namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = 16;  // the schema is 4 levels deep; anything far deeper is not a recipe
const SourceLoc kSetLoc{"--set", 0, 0};

// ---------------------------------------------------------------------------------------
// Small text helpers

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Makes arbitrary bytes safe to print inside a message (control bytes as \xNN).
std::string printable(const std::string& s, size_t max_len = 40) {
  size_t cut = std::min(max_len, s.size());
  while (cut < s.size() && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
  std::string out;
  for (unsigned char c : s.substr(0, cut)) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (cut < s.size()) out += "...";
  return out;
}

// Shortest text that reads back as the same double; plain digits (0.0003, not 3e-04)
// unless the number is very small or very large.
std::string format_number(double v) {
  char buf[400];
  const double a = std::fabs(v);
  const auto fmt = (a == 0 || (a >= 1e-4 && a < 1e15)) ? std::chars_format::fixed : std::chars_format::scientific;
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, fmt);
  if (ec != std::errc()) return std::to_string(v);
  return std::string(buf, end);
}

std::string format_json_scalar(const json& v) {
  if (v.is_number_float()) return format_number(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// ---------------------------------------------------------------------------------------
// YAML 1.2 core-schema scalars

std::optional<int64_t> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  int base = 10;
  size_t start = 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) base = s[1] == 'x' ? 16 : 8, start = 2;
  else if (s[0] == '+' || s[0] == '-') start = 1;
  if (start >= s.size()) return std::nullopt;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                               : (c >= '0' && c < static_cast<char>('0' + base));
    if (!ok) return std::nullopt;
  }
  uint64_t mag = 0;
  auto [p, ec] = std::from_chars(s.data() + start, s.data() + s.size(), mag, base);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;  // overflow: read as a float
  if (s[0] == '-') {
    if (mag > static_cast<uint64_t>(INT64_MAX) + 1) return std::nullopt;
    return static_cast<int64_t>(0 - mag);
  }
  if (mag > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<int64_t>(mag);
}

// [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?  (.inf and .nan stay text)
std::optional<double> parse_float(const std::string& s) {
  size_t i = 0;
  auto digits = [&] { size_t n = 0; while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++n; return n; };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t mantissa = i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return std::nullopt;
  } else {
    if (digits() == 0) return std::nullopt;
    if (i < s.size() && s[i] == '.') ++i, digits();
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data() + mantissa, s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return s[0] == '-' ? -v : v;
}

json resolve_scalar(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str") return s;  // quoted or block scalar
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (auto i = parse_int(s)) return *i;
  if (auto d = parse_float(s)) return *d;
  return s;
}

// ---------------------------------------------------------------------------------------
// The document: a typed JSON tree plus where each node was written

struct NodeInfo {
  int key_line = 0, key_col = 0;  // its key (for list items: the item itself); 1-based
  int val_line = 0, val_col = 0;  // its value; 0 when no value was written
  std::string raw;                // a scalar as written, for messages
  bool from_set = false;          // written by a --set override
};

std::string child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
std::string item_path(const std::string& parent, size_t i) { return parent + "[" + std::to_string(i) + "]"; }
std::string describe_path(const std::string& path) { return path.empty() ? "the recipe" : path; }

int line_of(const YAML::Mark& m) { return m.line >= 0 ? m.line + 1 : 0; }
int col_of(const YAML::Mark& m) { return m.column >= 0 ? m.column + 1 : 0; }

struct Doc {
  std::string file;
  json root;
  std::map<std::string, NodeInfo> nodes;  // display path ("batch.micro", "parallel.stage_layers[1]")

  const NodeInfo& info(const std::string& path) const {
    static const NodeInfo none;
    auto it = nodes.find(path);
    return it == nodes.end() ? none : it->second;
  }
  SourceLoc key_loc(const std::string& path) const {
    const NodeInfo& i = info(path);
    if (i.from_set) return kSetLoc;
    return SourceLoc{file, i.key_line, i.key_col};
  }
  SourceLoc value_loc(const std::string& path) const {
    const NodeInfo& i = info(path);
    if (i.from_set) return kSetLoc;
    if (i.val_line > 0) return SourceLoc{file, i.val_line, i.val_col};
    return SourceLoc{file, i.key_line, i.key_col};
  }
  void erase_subtree(const std::string& path) {
    for (auto it = nodes.begin(); it != nodes.end();) {
      const std::string& p = it->first;
      const bool under = p == path || (p.size() > path.size() && p.compare(0, path.size(), path) == 0 &&
                                       (p[path.size()] == '.' || p[path.size()] == '['));
      it = under ? nodes.erase(it) : std::next(it);
    }
  }
};

const char* yaml_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    default: return "a value";
  }
}

// Converts a yaml-cpp node into JSON, recording every node's position; `info` is the
// already-filled record of `n` itself. Duplicate keys are caught here: yaml-cpp keeps both.
json convert(const YAML::Node& n, const std::string& path, NodeInfo info, int depth, Doc& doc) {
  if (depth > kMaxDepth) {
    throw UserError(info.from_set ? kSetLoc : SourceLoc{doc.file, line_of(n.Mark()), col_of(n.Mark())},
                    "the value under '" + path.substr(0, path.find_first_of(".[")) + "' is nested more than " +
                        std::to_string(kMaxDepth) + " levels deep",
                    "a recipe has sections with keys (and a few lists) only; compare with recipes/quickstart.yaml");
  }
  json out;
  if (n.IsScalar()) {
    info.raw = n.Scalar();
    out = resolve_scalar(n);
  } else if (n.IsSequence()) {
    out = json::array();
    size_t i = 0;
    for (const YAML::Node& item : n) {
      NodeInfo ii;
      ii.from_set = info.from_set;
      ii.key_line = ii.val_line = line_of(item.Mark());
      ii.key_col = ii.val_col = col_of(item.Mark());
      if (item.IsNull()) ii.val_line = ii.val_col = 0;
      out.push_back(convert(item, item_path(path, i), ii, depth + 1, doc));
      ++i;
    }
  } else if (n.IsMap()) {
    out = json::object();
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node k = it->first;  // copies: the iterator hands out a temporary pair
      const YAML::Node v = it->second;
      const SourceLoc kloc = info.from_set ? kSetLoc : SourceLoc{doc.file, line_of(k.Mark()), col_of(k.Mark())};
      if (!k.IsScalar() || k.Scalar().empty())
        throw UserError(kloc, std::string("a key in ") + describe_path(path) + " is " +
                                  (k.IsScalar() || k.IsNull() ? std::string("empty") : yaml_kind(k)),
                        "keys are plain names followed by ': ', like micro: 8");
      const std::string key = k.Scalar();
      // Dotted keys are a --set habit; they would also make paths ambiguous.
      if (const size_t bad = key.find_first_of(".[]"); bad != std::string::npos) {
        const size_t dot = key.find('.');
        throw UserError(kloc, "key '" + printable(key) + "' contains '" + key[bad] + "'",
                        dot != std::string::npos && bad == dot
                            ? "nest it instead: write '" + printable(key.substr(0, dot)) + ":' and under it, indented, '" +
                                  printable(key.substr(dot + 1)) + ": ...' (dotted paths are for --set)"
                            : "keys are plain names like micro or stage_layers");
      }
      const std::string cpath = child_path(path, key);
      if (out.contains(key)) {
        const NodeInfo& first = doc.info(cpath);
        throw UserError(kloc, "duplicate key '" + printable(key) + "' in " + describe_path(path) +
                                  (first.key_line > 0 ? " (first written at line " + std::to_string(first.key_line) + ")" : ""),
                        "keep only one of them (YAML would otherwise silently use one)");
      }
      NodeInfo ci;
      ci.from_set = info.from_set;
      ci.key_line = line_of(k.Mark());
      ci.key_col = col_of(k.Mark());
      if (!v.IsNull()) ci.val_line = line_of(v.Mark()), ci.val_col = col_of(v.Mark());
      out[key] = convert(v, cpath, ci, depth + 1, doc);
    }
  }  // Null and Undefined stay JSON null
  doc.nodes[path] = info;
  return out;
}

// ---------------------------------------------------------------------------------------
// Reading the text

// Hints for yaml-cpp's syntax messages (exceptions.h, ErrorMsg).
std::string syntax_hint(const std::string& msg) {
  auto has = [&](const char* s) { return msg.find(s) != std::string::npos; };
  if (has("end of sequence flow")) return "close the list with ']'";
  if (has("end of map flow")) return "close the mapping with '}'";
  if (has("illegal flow end")) return "remove the stray ']' or '}'";
  if (has("escape")) return "inside double quotes write \\\\ for a backslash, or use single quotes";
  if (has("EOF in scalar") || (has("end of") && has("quote"))) return "close the quoted string";
  if (has("map value"))
    return "check the indentation (keys of one mapping start in the same column), and quote a value that contains ': '";
  if (has("end of map")) return "check the indentation: keys of one mapping must start in the same column";
  if (has("block entry") || has("end of sequence")) return "list items ('- ') must line up, indented under their key";
  if (has("anchor") || has("alias")) return "define an anchor (&name) before referring to it (*name)";
  return "check the indentation (spaces only), quotes and brackets around this point";
}

// The first line whose indentation contains a tab (YAML indents with spaces only).
std::optional<SourceLoc> find_tab_indent(const std::string& text, const std::string& file, int up_to_line) {
  int line = 1;
  size_t pos = 0;
  while (pos <= text.size() && line <= up_to_line) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    size_t i = pos;
    std::optional<size_t> tab;
    while (i < end && (text[i] == ' ' || text[i] == '\t')) {
      if (text[i] == '\t' && !tab) tab = i;
      ++i;
    }
    if (tab && i < end && text[i] != '#' && text[i] != '\r')
      return SourceLoc{file, line, static_cast<int>(*tab - pos) + 1};
    pos = end + 1;
    ++line;
  }
  return std::nullopt;
}

// The last '[' or '{' before line `up_to_line` that is never closed (quotes and comments
// skipped): yaml-cpp reports an unclosed list at the end of the file, the user wants the
// place where it was opened.
std::optional<SourceLoc> find_unclosed(const std::string& text, const std::string& file, char open) {
  struct Open { char c; int line, col; };
  std::vector<Open> stack;
  int line = 1, col = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ++col;
    if (c == '\n') {
      ++line, col = 0, comment = false;
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (c == quote) quote = 0;
      else if (c == '\\' && quote == '"') ++i, ++col;
      continue;
    }
    if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) comment = true;
    else if ((c == '"' || c == '\'') && (i == 0 || std::string(" \t[{,:").find(text[i - 1]) != std::string::npos)) quote = c;
    else if (c == '[' || c == '{') stack.push_back({c, line, col});
    else if ((c == ']' || c == '}') && !stack.empty()) stack.pop_back();
  }
  for (auto it = stack.rbegin(); it != stack.rend(); ++it)
    if (it->c == open) return SourceLoc{file, it->line, it->col};
  return std::nullopt;
}

// Rejects binary and non-UTF-8 input before the YAML parser sees it.
void check_text(const std::string& text, const std::string& file) {
  int line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0)
      throw UserError(SourceLoc{file, line, col}, "the file contains a NUL byte: it is binary, not a YAML recipe",
                      "point at a YAML text file, such as recipes/quickstart.yaml");
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (!ok) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02X", c);
      throw UserError(SourceLoc{file, line, col}, std::string("invalid UTF-8 byte ") + buf + " (is this a text file?)",
                      "save the recipe as UTF-8 text");
    }
    if (c == '\n') line++, col = 1;
    else col++;
    i += len;
  }
}

// Where the text's first content (not blank, not a comment, not a '---' marker) starts,
// and where a second YAML document would start. Scanned by hand because yaml-cpp 0.7's
// LoadAll() can loop forever on malformed streams (yaml-cpp issues #1040, PR #1319), so
// only Load() is used, and Load() silently drops every document after the first.
struct TextShape {
  std::optional<SourceLoc> first_content;
  std::optional<SourceLoc> second_document;
};

TextShape scan_shape(const std::string& text, const std::string& file) {
  TextShape shape;
  bool ended = false;  // after a '...' document end marker
  int line = 1;
  for (size_t pos = 0; pos < text.size() && !shape.second_document; ++line) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (line == 1 && l.compare(0, 3, "\xEF\xBB\xBF") == 0) l.erase(0, 3);  // UTF-8 byte order mark
    const auto is_marker = [&](const char* m) {
      return l.compare(0, 3, m) == 0 && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    };
    size_t first = l.find_first_not_of(" \t");
    const bool blank = first == std::string::npos || l[first] == '#';
    if (is_marker("---")) {
      if (shape.first_content || ended) {
        shape.second_document = SourceLoc{file, line, 1};
        break;
      }
      first = l.find_first_not_of(" \t", 3);
      if (first == std::string::npos || l[first] == '#') continue;  // an explicit start of the one document
    } else if (is_marker("...")) {
      ended = true;
      continue;
    } else if (blank) {
      continue;
    }
    if (ended) shape.second_document = SourceLoc{file, line, static_cast<int>(first) + 1};
    else if (!shape.first_content) shape.first_content = SourceLoc{file, line, static_cast<int>(first) + 1};
  }
  return shape;
}

Doc parse_document(const std::string& text, const std::string& file) {
  check_text(text, file);
  const TextShape shape = scan_shape(text, file);
  if (shape.second_document)
    throw UserError(*shape.second_document, "a second YAML document starts here",
                    "a recipe is one document: remove the '---' line and merge or delete what follows");
  YAML::Node top;
  try {
    top = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw UserError(SourceLoc{file, line_of(e.mark), col_of(e.mark)}, "the YAML is nested too deeply to be a recipe",
                    "a recipe has sections with keys (and a few lists) only; compare with recipes/quickstart.yaml");
  } catch (const YAML::Exception& e) {
    const int line = line_of(e.mark);
    if (auto tab = find_tab_indent(text, file, line > 0 ? line : 1 << 30))
      throw UserError(*tab, "tab character in indentation", "YAML indents with spaces only: replace the tab with spaces");
    const bool list = e.msg.find("end of sequence flow") != std::string::npos;
    if (list || e.msg.find("end of map flow") != std::string::npos)
      if (auto open = find_unclosed(text, file, list ? '[' : '{'))
        throw UserError(*open, std::string("YAML syntax error: this '") + (list ? "[" : "{") + "' is never closed",
                        list ? "close the list with ']'" : "close the mapping with '}'");
    throw UserError(SourceLoc{file, line, col_of(e.mark)}, "YAML syntax error: " + printable(e.msg, 80), syntax_hint(e.msg));
  }
  const std::string start_fix = "start from a shipped recipe, e.g. copy recipes/quickstart.yaml";
  if (top.IsNull() || !top.IsDefined()) {
    if (!shape.first_content)
      throw UserError(SourceLoc{file, 1, 1}, "the recipe is empty (no keys, only comments or blank lines)", start_fix);
    // Content that yaml-cpp read as nothing (e.g. a stray ',' or a lone '~').
    throw UserError(*shape.first_content, "YAML syntax error: this line does not start a 'key: value' mapping",
                    "a recipe starts with 'name: ...'; remove the stray characters here");
  }
  const SourceLoc top_loc{file, line_of(top.Mark()), col_of(top.Mark())};
  if (!top.IsMap()) {
    const std::string got = top.IsScalar() ? "the text '" + printable(top.Scalar()) + "'" : yaml_kind(top);
    throw UserError(top_loc, "the recipe must be a mapping of sections (name:, model:, ...), got " + got,
                    "write one 'key: value' per line (name: my-run, then model: with its keys indented), as in "
                    "recipes/quickstart.yaml");
  }
  Doc doc;
  doc.file = file;
  NodeInfo ri;
  ri.key_line = ri.val_line = top_loc.line;
  ri.key_col = ri.val_col = top_loc.col;
  try {
    doc.root = convert(top, "", ri, 0, doc);
  } catch (const YAML::Exception& e) {  // not expected after a successful parse; never let it escape raw
    throw UserError(SourceLoc{file, line_of(e.mark), col_of(e.mark)}, "could not read this YAML node",
                    syntax_hint(e.msg));
  }
  return doc;
}

// ---------------------------------------------------------------------------------------
// --set overrides: "a.b.c=value", the value parsed as YAML (so lists and mappings work)

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void apply_override(Doc& doc, const std::string& spec) {
  const std::string usage = "write --set section.key=value, e.g. --set batch.micro=8 or --set parallel.stage_layers=[4,4]";
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) throw UserError(kSetLoc, "malformed override '" + printable(spec) + "': no '='", usage);
  const std::string path = spec.substr(0, eq), text = spec.substr(eq + 1);
  std::vector<std::string> segs;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    segs.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const std::string& s : segs) {
    const bool ok = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!ok)
      throw UserError(kSetLoc, "malformed override '" + printable(spec) + "': the key path '" + printable(path) +
                                   "' must be names joined by dots", usage);
  }
  YAML::Node value;
  try {
    check_text(text, "--set");
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UserError(kSetLoc, "malformed override '" + printable(spec) + "': the value is not valid YAML (" +
                                 printable(e.msg, 60) + ")",
                    "quote the value or fix its brackets, e.g. --set parallel.stage_layers=[4,4]");
  } catch (const UserError& e) {
    throw UserError(kSetLoc, "malformed override '" + printable(spec) + "': " + e.problem(), e.fix());
  }

  // Walk to the parent, creating mappings on the way (a missing section is fine: the schema
  // still rejects unknown names).
  json* cur = &doc.root;
  std::string cur_path;
  NodeInfo set_info;
  set_info.from_set = true;
  for (size_t i = 0; i < segs.size(); ++i) {
    const std::string& s = segs[i];
    const bool last = i + 1 == segs.size();
    if (cur->is_null()) *cur = json::object();
    std::string next_path;
    json* next = nullptr;
    if (cur->is_object()) {
      next_path = child_path(cur_path, s);
      if (!cur->contains(s)) {
        (*cur)[s] = last ? json() : json::object();
        doc.nodes[next_path] = set_info;
      }
      next = &(*cur)[s];
    } else if (cur->is_array() && is_index(s) && std::stoul(s) < cur->size()) {
      next_path = item_path(cur_path, std::stoul(s));
      next = &(*cur)[std::stoul(s)];
    } else {
      const std::string what = cur->is_array() ? "a list of " + std::to_string(cur->size()) + " items" : "a single value";
      throw UserError(kSetLoc, "cannot apply --set " + printable(spec) + ": " + describe_path(cur_path) + " is " + what,
                      cur->is_array() ? "replace the whole list, e.g. --set " + cur_path + "=[4,4]"
                                      : "set " + describe_path(cur_path) + " itself, e.g. --set " + cur_path + "=...");
    }
    cur = next;
    cur_path = next_path;
  }
  doc.erase_subtree(cur_path);
  *cur = convert(value, cur_path, set_info, 1, doc);
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
  if (const char* env = std::getenv("RUNNER_SCHEMA"); env && *env) {
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

struct Problem {
  int rank = 0;  // 0: a problem with a value or key; 1: a missing key (reported after the others)
  SourceLoc loc;
  bool from_set = false;
  std::string what, fix;
};

std::string type_phrase(const std::string& t) {
  if (t == "integer") return "an integer";
  if (t == "number") return "a number";
  if (t == "string") return "a string";
  if (t == "boolean") return "true or false";
  if (t == "object") return "a mapping (keys indented under it)";
  if (t == "array") return "a list";
  return t;
}

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

// How a value is shown in a message: the text as written where we have it.
std::string shown(const json& v, const NodeInfo& info) {
  if (v.is_null()) return "nothing";
  if (v.is_object()) return "a mapping";
  if (v.is_array()) return "a list";
  if (v.is_string()) return "'" + printable(v.get<std::string>()) + "'";
  if (!info.raw.empty()) return printable(info.raw);
  return format_json_scalar(v);
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
  if (sub.contains("examples") && sub["examples"].is_array() && !sub["examples"].empty())
    return format_json_scalar(sub["examples"][0]);
  if (sub.contains("default")) return format_json_scalar(sub["default"]);
  if (sub.contains("minimum")) return format_json_scalar(sub["minimum"]);
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
  if (v.is_null()) {
    if (t == "object") {
      p.what = path + " is empty";
      p.fix = sub.contains("required")
                  ? "indent its keys under it: " + join(sub["required"].get<std::vector<std::string>>(), ", ")
                  : "write " + last_key(path) + ": {} for all defaults, or indent its keys under it, or remove it";
    } else {
      p.what = path + " has no value";
      p.fix = "write a value after '" + last_key(path) + ": ' (like " + example_of(sub, v) +
              "), or remove the line to use the default";
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
void diagnose_node(const json& v, const json& sub, const std::string& path, const Doc& doc, std::vector<Problem>& out) {
  if (!sub.is_object()) return;
  const NodeInfo& info = doc.info(path);
  if (sub.contains("type") && sub["type"].is_string() && !type_matches(v, sub["type"].get<std::string>())) {
    type_problem(v, sub, path, doc, out);
    return;
  }
  if (sub.contains("enum") && sub["enum"].is_array()) {
    bool found = false;
    std::vector<std::string> options;
    for (const json& e : sub["enum"]) {
      found = found || e == v;
      options.push_back(format_json_scalar(e));
    }
    if (!found) {
      Problem p;
      p.loc = doc.value_loc(path);
      p.from_set = info.from_set;
      p.what = path + " must be one of " + join(options, ", ") + ", got " + shown(v, info);
      const auto best = v.is_string() ? closest(v.get<std::string>(), options) : std::nullopt;
      p.fix = best ? "did you mean '" + *best + "'?" : "pick one of those";
      out.push_back(p);
      return;
    }
  }
  if (v.is_number()) {
    const size_t before = out.size();
    range_problem(v, sub, path, doc, out);
    if (out.size() > before) return;
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const std::string hint = sub.value("x-hint", "");
    if (sub.contains("minLength") && s.size() < sub["minLength"].get<size_t>()) {
      out.push_back({0, doc.value_loc(path), info.from_set, path + " is empty", hint.empty() ? "write at least one character" : hint});
      return;
    }
    if (sub.contains("pattern")) {
      bool ok = true;
      try {
        ok = std::regex_search(s, std::regex(sub["pattern"].get<std::string>()));
      } catch (const std::regex_error&) {
      }
      if (!ok) {
        out.push_back({0, doc.value_loc(path), info.from_set, path + " '" + printable(s) + "' is not allowed",
                       hint.empty() ? "it must match " + sub["pattern"].get<std::string>() : hint});
        return;
      }
    }
  }
  if (v.is_array() && sub.value("uniqueItems", false)) {
    for (size_t j = 1; j < v.size(); ++j)
      for (size_t i = 0; i < j; ++i)
        if (v[i] == v[j]) {
          const std::string ip = item_path(path, j);
          out.push_back({0, doc.value_loc(ip), doc.info(ip).from_set,
                         path + " lists " + shown(v[j], doc.info(ip)) + " twice", "remove the repeated entry"});
          return;
        }
  }
  if (v.is_object()) {
    const auto names = property_names(sub);
    if (sub.contains("additionalProperties") && sub["additionalProperties"] == false) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (std::find(names.begin(), names.end(), it.key()) != names.end()) continue;
        const std::string cp = child_path(path, it.key());
        Problem p;
        p.loc = doc.key_loc(cp);
        p.from_set = doc.info(cp).from_set;
        p.what = "unknown key '" + printable(it.key()) + "' " + (path.empty() ? "at the top level" : "in " + path);
        std::vector<std::string> owners;
        find_key_owners(recipe_schema().doc, "", it.key(), owners);
        if (auto best = closest(it.key(), names)) p.fix = "did you mean '" + *best + "'?";
        else if (!owners.empty()) p.fix = "'" + it.key() + "' belongs under " + owners[0] + ": move it there";
        else p.fix = "allowed keys " + (path.empty() ? std::string("at the top level") : "in " + path) + ": " + join(names, ", ");
        out.push_back(p);
      }
    }
    if (sub.contains("required") && sub["required"].is_array()) {
      for (const json& r : sub["required"]) {
        const std::string k = r.get<std::string>();
        if (v.contains(k)) continue;
        const json& ks = sub["properties"].contains(k) ? sub["properties"][k] : json::object();
        Problem p;
        p.rank = 1;
        p.loc = doc.key_loc(path);
        p.from_set = info.from_set;
        p.what = describe_path(path) + " is missing required key '" + k + "'";
        if (ks.value("type", "") == "object") {
          const auto req = ks.contains("required") ? ks["required"].get<std::vector<std::string>>() : std::vector<std::string>{};
          p.fix = "add a " + k + ": section" + (req.empty() ? std::string() : " with " + join(req, ", ") + " indented under it");
        } else {
          p.fix = "add " + k + ": " + placeholder(ks);
        }
        out.push_back(p);
      }
    }
  }
}

// Validates the document; throws the first problem (in file order; missing keys last).
void validate_against_schema(const Doc& doc) {
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
  if (ok) return;

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
                         "see its description in " + store.path};
  }
  if (problems.empty()) {
    if (fallback) throw UserError(fallback->loc, fallback->what, fallback->fix);
    throw UserError(SourceLoc{doc.file}, "the recipe does not match the schema",
                    "compare it with recipes/quickstart.yaml and " + store.path);
  }
  const Problem& first = *std::min_element(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
    return std::tie(a.rank, a.from_set, a.loc.line, a.loc.col) < std::tie(b.rank, b.from_set, b.loc.line, b.loc.col);
  });
  throw UserError(first.loc, first.what, first.fix);
}

// ---------------------------------------------------------------------------------------
// Filling the structs (types were checked by the schema; the checks here only guard
// against a schema that drifted from recipe.h, and still say where)

class Filler {
 public:
  explicit Filler(const Doc& doc) : doc_(doc) {}

  // The section `name` of `parent` when written.
  const json* section(const json& parent, const std::string& parent_path, const std::string& name) const {
    if (!parent.contains(name)) return nullptr;
    const json& s = parent[name];
    if (!s.is_object()) wrong(child_path(parent_path, name), "object", s);
    return &s;
  }
  void get(const json& o, const std::string& p, const char* k, int64_t& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_number_integer()) wrong(child_path(p, k), "integer", *v);
      out = v->get<int64_t>();
    }
  }
  void get(const json& o, const std::string& p, const char* k, double& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_number()) wrong(child_path(p, k), "number", *v);
      out = v->get<double>();
    }
  }
  void get(const json& o, const std::string& p, const char* k, bool& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_boolean()) wrong(child_path(p, k), "boolean", *v);
      out = v->get<bool>();
    }
  }
  void get(const json& o, const std::string& p, const char* k, std::string& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_string()) wrong(child_path(p, k), "string", *v);
      out = v->get<std::string>();
    }
  }
  void get(const json& o, const std::string& p, const char* k, std::vector<int64_t>& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_array()) wrong(child_path(p, k), "array", *v);
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_number_integer()) wrong(item_path(child_path(p, k), i), "integer", (*v)[i]);
        out.push_back((*v)[i].get<int64_t>());
      }
    }
  }
  void get(const json& o, const std::string& p, const char* k, std::vector<std::string>& out) const {
    if (const json* v = find(o, k)) {
      if (!v->is_array()) wrong(child_path(p, k), "array", *v);
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) wrong(item_path(child_path(p, k), i), "string", (*v)[i]);
        out.push_back((*v)[i].get<std::string>());
      }
    }
  }

 private:
  static const json* find(const json& o, const char* k) { return o.contains(k) ? &o[k] : nullptr; }
  [[noreturn]] void wrong(const std::string& path, const std::string& type, const json& v) const {
    throw UserError(doc_.value_loc(path), path + " must be " + type_phrase(type) + ", got " + shown(v, doc_.info(path)),
                    "fix the value (and check that schemas/recipe.schema.json matches this build)");
  }
  const Doc& doc_;
};

void fill(const Doc& doc, Recipe& r) {
  const Filler f(doc);
  const json& root = doc.root;
  f.get(root, "", "name", r.name);
  if (const json* s = f.section(root, "", "model")) {
    ModelConfig& m = r.model;
    const std::string p = "model";
    f.get(*s, p, "family", m.family);
    f.get(*s, p, "vocab_size", m.vocab_size);
    f.get(*s, p, "seq_len", m.seq_len);
    f.get(*s, p, "d_model", m.d_model);
    f.get(*s, p, "n_layers", m.n_layers);
    f.get(*s, p, "n_heads", m.n_heads);
    f.get(*s, p, "mlp_ratio", m.mlp_ratio);
    f.get(*s, p, "norm", m.norm);
    f.get(*s, p, "activation", m.activation);
    f.get(*s, p, "position", m.position);
    f.get(*s, p, "tie_embeddings", m.tie_embeddings);
    f.get(*s, p, "bias", m.bias);
    f.get(*s, p, "dropout", m.dropout);
    f.get(*s, p, "norm_eps", m.norm_eps);
    f.get(*s, p, "rope_theta", m.rope_theta);
    f.get(*s, p, "init_std", m.init_std);
  }
  if (const json* s = f.section(root, "", "data")) {
    DataConfig& d = r.data;
    const std::string p = "data";
    f.get(*s, p, "kind", d.kind);
    f.get(*s, p, "path", d.path);
    f.get(*s, p, "val_path", d.val_path);
    f.get(*s, p, "val_fraction", d.val_fraction);
    f.get(*s, p, "dataset", d.dataset);
    f.get(*s, p, "digits", d.digits);
    f.get(*s, p, "workers", d.workers);
    f.get(*s, p, "prefetch", d.prefetch);
  }
  if (const json* s = f.section(root, "", "parallel")) {
    ParallelConfig& q = r.parallel;
    const std::string p = "parallel";
    f.get(*s, p, "dp", q.dp);
    f.get(*s, p, "tp", q.tp);
    f.get(*s, p, "pp", q.pp);
    f.get(*s, p, "schedule", q.schedule);
    f.get(*s, p, "virtual_stages", q.virtual_stages);
    f.get(*s, p, "zero", q.zero);
    f.get(*s, p, "sequence_parallel", q.sequence_parallel);
    f.get(*s, p, "stage_layers", q.stage_layers);
    f.get(*s, p, "bucket_mb", q.bucket_mb);
  }
  if (const json* s = f.section(root, "", "batch")) {
    f.get(*s, "batch", "global", r.batch.global);
    f.get(*s, "batch", "micro", r.batch.micro);
    f.get(*s, "batch", "accum", r.batch.accum);
  }
  if (const json* s = f.section(root, "", "precision")) {
    PrecisionConfig& q = r.precision;
    const std::string p = "precision";
    f.get(*s, p, "compute", q.compute);
    f.get(*s, p, "master_weights", q.master_weights);
    f.get(*s, p, "grad_accum", q.grad_accum);
    if (const json* ls = f.section(*s, p, "loss_scale")) {
      const std::string lp = "precision.loss_scale";
      f.get(*ls, lp, "mode", q.loss_scale.mode);
      f.get(*ls, lp, "init", q.loss_scale.init);
      f.get(*ls, lp, "growth_factor", q.loss_scale.growth_factor);
      f.get(*ls, lp, "backoff_factor", q.loss_scale.backoff_factor);
      f.get(*ls, lp, "growth_interval", q.loss_scale.growth_interval);
    }
  }
  if (const json* s = f.section(root, "", "recompute")) {
    f.get(*s, "recompute", "mode", r.recompute.mode);
    f.get(*s, "recompute", "layers", r.recompute.layers);
    f.get(*s, "recompute", "modules", r.recompute.modules);
  }
  if (const json* s = f.section(root, "", "optimizer")) {
    OptimizerConfig& o = r.optimizer;
    const std::string p = "optimizer";
    f.get(*s, p, "name", o.name);
    f.get(*s, p, "lr", o.lr);
    f.get(*s, p, "beta1", o.beta1);
    f.get(*s, p, "beta2", o.beta2);
    f.get(*s, p, "eps", o.eps);
    f.get(*s, p, "weight_decay", o.weight_decay);
    f.get(*s, p, "grad_clip", o.grad_clip);
    if (const json* sc = f.section(*s, p, "schedule")) {
      const std::string sp = "optimizer.schedule";
      f.get(*sc, sp, "kind", o.schedule.kind);
      f.get(*sc, sp, "warmup_steps", o.schedule.warmup_steps);
      f.get(*sc, sp, "min_lr_ratio", o.schedule.min_lr_ratio);
    }
  }
  if (const json* s = f.section(root, "", "checkpoint")) {
    CheckpointConfig& c = r.checkpoint;
    const std::string p = "checkpoint";
    f.get(*s, p, "dir", c.dir);
    f.get(*s, p, "cadence", c.cadence);
    f.get(*s, p, "every_steps", c.every_steps);
    f.get(*s, p, "every_minutes", c.every_minutes);
    f.get(*s, p, "keep_last", c.keep_last);
    f.get(*s, p, "keep_every", c.keep_every);
    f.get(*s, p, "async", c.async);
    f.get(*s, p, "optimizer_dtype", c.optimizer_dtype);
    f.get(*s, p, "snapshot_every", c.snapshot_every);
    f.get(*s, p, "spike_threshold", c.spike_threshold);
  }
  if (const json* s = f.section(root, "", "hardware")) {
    HardwareConfig& h = r.hardware;
    const std::string p = "hardware";
    f.get(*s, p, "device", h.device);
    f.get(*s, p, "memory_gb", h.memory_gb);
    f.get(*s, p, "devices_per_node", h.devices_per_node);
    f.get(*s, p, "nodes", h.nodes);
    f.get(*s, p, "peak_tflops", h.peak_tflops);
  }
  if (const json* s = f.section(root, "", "train")) {
    TrainConfig& t = r.train;
    const std::string p = "train";
    f.get(*s, p, "steps", t.steps);
    f.get(*s, p, "seed", t.seed);
    f.get(*s, p, "log_every", t.log_every);
    f.get(*s, p, "eval_every", t.eval_every);
    f.get(*s, p, "eval_batches", t.eval_batches);
    f.get(*s, p, "threads", t.threads);
    f.get(*s, p, "run_dir", t.run_dir);
  }
  if (const json* s = f.section(root, "", "inference")) {
    InferenceConfig inf;
    f.get(*s, "inference", "batch", inf.batch);
    f.get(*s, "inference", "context", inf.context);
    f.get(*s, "inference", "kv_dtype", inf.kv_dtype);
    r.inference = inf;
  }

  // Checkpoint cadence follows from what was written: every_minutes alone means minutes;
  // nothing at all means one checkpoint at the end of training.
  const auto written = [&](const char* p) { return doc.nodes.count(p) > 0; };
  CheckpointConfig& c = r.checkpoint;
  if (!written("checkpoint.cadence")) {
    if (written("checkpoint.every_minutes") && !written("checkpoint.every_steps")) c.cadence = "minutes";
    else if (!written("checkpoint.every_steps") && !written("checkpoint.every_minutes")) c.every_steps = r.train.steps;
  }

  for (const auto& [path, info] : doc.nodes) {
    if (path.empty()) continue;
    r.locs[path] = info.from_set ? kSetLoc : SourceLoc{doc.file, info.key_line, info.key_col};
  }
}

// ---------------------------------------------------------------------------------------
// Emitting the resolved recipe

std::string yaml_string(const std::string& s) {
  static const std::set<std::string> reserved = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"};
  bool plain = !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_') && !reserved.count(lower(s));
  for (char c : s)
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/');
  if (plain) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string yaml_double(double v) {
  std::string s = format_number(v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

class YamlWriter {
 public:
  void section(const std::string& name, int indent) { line(indent, name + ":"); }
  void kv(int indent, const std::string& k, const std::string& v) { line(indent, k + ": " + v); }
  void kv(int indent, const std::string& k, int64_t v) { kv(indent, k, std::to_string(v)); }
  void kv(int indent, const std::string& k, double v) { kv(indent, k, yaml_double(v)); }
  void kv(int indent, const std::string& k, bool v) { kv(indent, k, std::string(v ? "true" : "false")); }
  void str(int indent, const std::string& k, const std::string& v) { kv(indent, k, yaml_string(v)); }
  void ints(int indent, const std::string& k, const std::vector<int64_t>& v) {
    std::vector<std::string> s;
    for (int64_t x : v) s.push_back(std::to_string(x));
    kv(indent, k, "[" + join(s, ", ") + "]");
  }
  void strs(int indent, const std::string& k, const std::vector<std::string>& v) {
    std::vector<std::string> s;
    for (const std::string& x : v) s.push_back(yaml_string(x));
    kv(indent, k, "[" + join(s, ", ") + "]");
  }
  void line(int indent, const std::string& s) { out_ += std::string(static_cast<size_t>(indent) * 2, ' ') + s + "\n"; }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API

void validate_recipe(const Recipe& r) {
  const auto fail = [&](const std::string& path, const std::string& what, const std::string& fix) {
    throw UserError(r.loc(path), what, fix);
  };
  const auto S = [](auto v) { return std::to_string(v); };
  const ModelConfig& m = r.model;

  // Model shape.
  // Suggestions search a small window only: absurd sizes still get an error, just no example.
  constexpr int64_t kWindow = 4096;
  if (m.n_heads > 0 && m.d_model % m.n_heads != 0) {
    std::vector<std::string> heads;
    for (int64_t nh = m.n_heads - 1; nh >= 1 && nh > m.n_heads - kWindow; --nh)
      if (m.d_model % nh == 0) { heads.push_back(S(nh)); break; }
    for (int64_t nh = m.n_heads + 1; nh <= m.d_model && nh < m.n_heads + kWindow; ++nh)
      if (m.d_model % nh == 0) { heads.push_back(S(nh)); break; }
    std::vector<std::string> widths;
    const int64_t d_lo = m.d_model / m.n_heads * m.n_heads;
    if (d_lo > 0) widths.push_back(S(d_lo));
    if (d_lo <= INT64_MAX - m.n_heads) widths.push_back(S(d_lo + m.n_heads));
    fail("model.n_heads",
         "model.d_model " + S(m.d_model) + " is not divisible by model.n_heads " + S(m.n_heads),
         (heads.empty() ? std::string() : "pick n_heads dividing " + S(m.d_model) + ", like " + join(heads, " or ") + ", or ") +
             "set d_model to a multiple of " + S(m.n_heads) + (widths.empty() ? std::string() : ", like " + join(widths, " or ")));
  }
  if (m.position == "rope" && m.n_heads > 0 && (m.d_model / m.n_heads) % 2 != 0) {
    std::string better;
    for (int64_t dist = 1; dist < kWindow && better.empty(); ++dist)
      for (int64_t nh : {m.n_heads - dist, m.n_heads + dist})
        if (better.empty() && nh >= 1 && nh <= m.d_model && m.d_model % nh == 0 && (m.d_model / nh) % 2 == 0)
          better = "n_heads " + S(nh) + " (head size " + S(m.d_model / nh) + ")";
    fail(r.locs.count("model.position") ? "model.position" : "model.n_heads",
         "position rope needs an even head size, but d_model " + S(m.d_model) + " / n_heads " + S(m.n_heads) + " = " +
             S(m.d_model / m.n_heads),
         "rope rotates pairs of channels: " + (better.empty() ? std::string("change d_model") : "use " + better) +
             ", or use position: learned");
  }
  if (m.mlp_hidden() < 1)
    fail("model.mlp_ratio", "model.mlp_ratio " + format_number(m.mlp_ratio) + " x d_model " + S(m.d_model) + " rounds to an empty MLP",
         "use a larger mlp_ratio, like 4.0");

  // Parallel layout (only what needs no world size; the plan checks the rest).
  const ParallelConfig& q = r.parallel;
  if (!q.stage_layers.empty()) {
    std::string even;  // an even split, as an example
    if (q.pp <= m.n_layers && q.pp <= 64) {
      std::vector<std::string> parts;
      for (int64_t s = 0; s < q.pp; ++s) parts.push_back(S(m.n_layers / q.pp + (s < m.n_layers % q.pp ? 1 : 0)));
      even = "[" + join(parts, ", ") + "]";
    }
    int64_t sum = 0;
    for (int64_t x : q.stage_layers) sum = x > INT64_MAX - sum ? INT64_MAX : sum + x;  // entries are >= 1
    if (static_cast<int64_t>(q.stage_layers.size()) != q.pp)
      fail("parallel.stage_layers",
           "parallel.stage_layers has " + S(q.stage_layers.size()) + (q.stage_layers.size() == 1 ? " entry" : " entries") +
               " but parallel.pp is " + S(q.pp),
           "give one layer count per pipeline stage" + (even.empty() ? std::string() : ", e.g. " + even) +
               ", or remove stage_layers for an even split");
    if (sum != m.n_layers)
      fail("parallel.stage_layers",
           "parallel.stage_layers adds up to " + S(sum) + " layers but model.n_layers is " + S(m.n_layers),
           "make the entries add up to " + S(m.n_layers) + (even.empty() ? std::string() : ", e.g. " + even));
  }
  if (q.schedule == "interleaved") {
    if (q.pp < 2)
      fail("parallel.schedule", "schedule interleaved needs pipeline stages, but parallel.pp is " + S(q.pp),
           "set pp >= 2, or use schedule: 1f1b");
    if (q.virtual_stages < 2)
      fail(r.locs.count("parallel.virtual_stages") ? "parallel.virtual_stages" : "parallel.schedule",
           "schedule interleaved needs parallel.virtual_stages >= 2, got " + S(q.virtual_stages),
           "set virtual_stages: 2 (model chunks per stage)");
  } else if (q.virtual_stages != 1) {
    fail("parallel.virtual_stages", "parallel.virtual_stages " + S(q.virtual_stages) + " only applies to schedule interleaved",
         "set schedule: interleaved, or remove virtual_stages");
  }

  // Recompute.
  const RecomputeConfig& rc = r.recompute;
  for (size_t i = 0; i < rc.layers.size(); ++i)
    if (rc.layers[i] < 0 || rc.layers[i] >= m.n_layers)
      fail("recompute.layers[" + S(i) + "]",
           "recompute.layers lists layer " + S(rc.layers[i]) + ", but the model has " + S(m.n_layers) +
               " layers (0 to " + S(m.n_layers - 1) + ")",
           "list layers from 0 to " + S(m.n_layers - 1) + ", or leave layers empty for all of them");
  if (rc.mode == "selective" && rc.modules.empty())
    fail("recompute.mode", "recompute mode selective needs recompute.modules",
         "add modules: [attention_core] under recompute, or use mode: full");
  if (rc.mode != "selective" && !rc.modules.empty())
    fail("recompute.modules", "recompute.modules only applies to mode selective (mode is " + rc.mode + ")",
         "set recompute.mode: selective, or remove modules");
  if (rc.mode == "none" && !rc.layers.empty())
    fail("recompute.layers", "recompute.layers has no effect with mode none",
         "set recompute.mode: full or selective, or remove layers");

  // Checkpoints.
  const CheckpointConfig& c = r.checkpoint;
  if (c.cadence == "steps" && c.every_steps <= 0) {
    const int64_t n = std::max<int64_t>(1, r.train.steps / 4);
    fail(r.locs.count("checkpoint.cadence") ? "checkpoint.cadence" : "checkpoint.every_steps",
         "checkpoint cadence steps needs checkpoint.every_steps > 0",
         "add every_steps under checkpoint, e.g. every_steps: " + S(n) + " (4 checkpoints in " + S(r.train.steps) +
             " steps), or use cadence: never");
  }
  if (c.cadence == "minutes" && !(c.every_minutes > 0))
    fail(r.locs.count("checkpoint.cadence") ? "checkpoint.cadence" : "checkpoint.every_minutes",
         "checkpoint cadence minutes needs checkpoint.every_minutes > 0",
         "add every_minutes under checkpoint, e.g. every_minutes: 30, or use cadence: never");
  if (c.cadence != "steps" && c.every_steps > 0)
    fail("checkpoint.every_steps", "checkpoint.every_steps has no effect with cadence " + c.cadence,
         "set cadence: steps, or remove every_steps");
  if (c.cadence != "minutes" && c.every_minutes > 0)
    fail("checkpoint.every_minutes", "checkpoint.every_minutes has no effect with cadence " + c.cadence,
         "set cadence: minutes, or remove every_minutes");
  if (c.spike_threshold > 0 && c.spike_threshold <= 1)
    fail("checkpoint.spike_threshold",
         "checkpoint.spike_threshold must be 0 (off) or above 1, got " + format_number(c.spike_threshold),
         "it is a multiple of the running mean loss: use e.g. 3, or 0 to turn spike rollback off");

  // Data and hardware.
  const DataConfig& d = r.data;
  if (d.kind != "addition" && d.path.empty())
    fail("data.kind", "data kind " + d.kind + " needs data.path", "add path: <file> under data, e.g. path: data/tinyshakespeare.txt");
  if (d.kind == "addition" && !d.path.empty())
    fail("data.path", "data.path is not used by data kind addition (the task is generated)",
         "remove path, or set kind: text, hdf5 or bin");
  if (r.hardware.device == "custom" && !(r.hardware.memory_gb > 0))
    fail("hardware.device", "hardware device custom needs hardware.memory_gb",
         "add memory_gb: <GB per device> under hardware, e.g. memory_gb: 80");
  if (r.inference && m.position == "learned" && r.inference->context > m.seq_len)
    fail("inference.context",
         "inference.context " + S(r.inference->context) + " exceeds model.seq_len " + S(m.seq_len) +
             ", and learned positions stop at seq_len",
         "use context <= " + S(m.seq_len) + " (0 means seq_len), or position: rope");
}

Recipe load_recipe_text(const std::string& text, const std::string& display_name,
                        const std::vector<std::string>& overrides) {
  Doc doc = parse_document(text, display_name);
  for (const std::string& o : overrides) apply_override(doc, o);
  validate_against_schema(doc);
  Recipe r;
  r.source_file = display_name;
  r.source_text = text;
  if (!overrides.empty()) {
    if (!r.source_text.empty() && r.source_text.back() != '\n') r.source_text += '\n';
    for (const std::string& o : overrides) r.source_text += "# --set " + o + "\n";
  }
  fill(doc, r);
  validate_recipe(r);
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UserError(SourceLoc{path}, "this is a directory, not a recipe file", "name a .yaml file, e.g. recipes/quickstart.yaml");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const bool exists = fs::exists(path, ec);
    throw UserError(SourceLoc{path}, exists ? "cannot read the recipe file (permission denied?)" : "recipe file not found",
                    exists ? "check the file's permissions" : "check the path; shipped recipes live in recipes/, e.g. recipes/quickstart.yaml");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError(SourceLoc{path}, "cannot read the recipe file", "check that it is a readable text file");
  return load_recipe_text(ss.str(), path, overrides);
}

std::string recipe_to_yaml(const Recipe& r) {
  YamlWriter w;
  w.line(0, "# The recipe as resolved by runner: every default filled in.");
  w.str(0, "name", r.name);
  const ModelConfig& m = r.model;
  w.section("model", 0);
  w.str(1, "family", m.family);
  w.kv(1, "vocab_size", m.vocab_size);
  w.kv(1, "seq_len", m.seq_len);
  w.kv(1, "d_model", m.d_model);
  w.kv(1, "n_layers", m.n_layers);
  w.kv(1, "n_heads", m.n_heads);
  w.kv(1, "mlp_ratio", m.mlp_ratio);
  w.str(1, "norm", m.norm);
  w.str(1, "activation", m.activation);
  w.str(1, "position", m.position);
  w.kv(1, "tie_embeddings", m.tie_embeddings);
  w.kv(1, "bias", m.bias);
  w.kv(1, "dropout", m.dropout);
  w.kv(1, "norm_eps", m.norm_eps);
  w.kv(1, "rope_theta", m.rope_theta);
  w.kv(1, "init_std", m.init_std);
  const DataConfig& d = r.data;
  w.section("data", 0);
  w.str(1, "kind", d.kind);
  w.str(1, "path", d.path);
  w.str(1, "val_path", d.val_path);
  w.kv(1, "val_fraction", d.val_fraction);
  w.str(1, "dataset", d.dataset);
  w.kv(1, "digits", d.digits);
  w.kv(1, "workers", d.workers);
  w.kv(1, "prefetch", d.prefetch);
  const ParallelConfig& q = r.parallel;
  w.section("parallel", 0);
  w.kv(1, "dp", q.dp);
  w.kv(1, "tp", q.tp);
  w.kv(1, "pp", q.pp);
  w.str(1, "schedule", q.schedule);
  w.kv(1, "virtual_stages", q.virtual_stages);
  w.kv(1, "zero", q.zero);
  w.kv(1, "sequence_parallel", q.sequence_parallel);
  w.ints(1, "stage_layers", q.stage_layers);
  w.kv(1, "bucket_mb", q.bucket_mb);
  w.section("batch", 0);
  w.kv(1, "global", r.batch.global);
  w.kv(1, "micro", r.batch.micro);
  w.kv(1, "accum", r.batch.accum);
  const PrecisionConfig& p = r.precision;
  w.section("precision", 0);
  w.str(1, "compute", p.compute);
  w.str(1, "master_weights", p.master_weights);
  w.str(1, "grad_accum", p.grad_accum);
  w.section("loss_scale", 1);
  w.str(2, "mode", p.loss_scale.mode);
  w.kv(2, "init", p.loss_scale.init);
  w.kv(2, "growth_factor", p.loss_scale.growth_factor);
  w.kv(2, "backoff_factor", p.loss_scale.backoff_factor);
  w.kv(2, "growth_interval", p.loss_scale.growth_interval);
  w.section("recompute", 0);
  w.str(1, "mode", r.recompute.mode);
  w.ints(1, "layers", r.recompute.layers);
  w.strs(1, "modules", r.recompute.modules);
  const OptimizerConfig& o = r.optimizer;
  w.section("optimizer", 0);
  w.str(1, "name", o.name);
  w.kv(1, "lr", o.lr);
  w.kv(1, "beta1", o.beta1);
  w.kv(1, "beta2", o.beta2);
  w.kv(1, "eps", o.eps);
  w.kv(1, "weight_decay", o.weight_decay);
  w.kv(1, "grad_clip", o.grad_clip);
  w.section("schedule", 1);
  w.str(2, "kind", o.schedule.kind);
  w.kv(2, "warmup_steps", o.schedule.warmup_steps);
  w.kv(2, "min_lr_ratio", o.schedule.min_lr_ratio);
  const CheckpointConfig& c = r.checkpoint;
  w.section("checkpoint", 0);
  w.str(1, "dir", c.dir);
  w.str(1, "cadence", c.cadence);
  w.kv(1, "every_steps", c.every_steps);
  w.kv(1, "every_minutes", c.every_minutes);
  w.kv(1, "keep_last", c.keep_last);
  w.kv(1, "keep_every", c.keep_every);
  w.kv(1, "async", c.async);
  w.str(1, "optimizer_dtype", c.optimizer_dtype);
  w.kv(1, "snapshot_every", c.snapshot_every);
  w.kv(1, "spike_threshold", c.spike_threshold);
  const HardwareConfig& h = r.hardware;
  w.section("hardware", 0);
  w.str(1, "device", h.device);
  w.kv(1, "memory_gb", h.memory_gb);
  w.kv(1, "devices_per_node", h.devices_per_node);
  w.kv(1, "nodes", h.nodes);
  w.kv(1, "peak_tflops", h.peak_tflops);
  const TrainConfig& t = r.train;
  w.section("train", 0);
  w.kv(1, "steps", t.steps);
  w.kv(1, "seed", t.seed);
  w.kv(1, "log_every", t.log_every);
  w.kv(1, "eval_every", t.eval_every);
  w.kv(1, "eval_batches", t.eval_batches);
  w.kv(1, "threads", t.threads);
  w.str(1, "run_dir", t.run_dir);
  if (r.inference) {
    w.section("inference", 0);
    w.kv(1, "batch", r.inference->batch);
    w.kv(1, "context", r.inference->context);
    w.str(1, "kv_dtype", r.inference->kv_dtype);
  }
  return w.text();
}

}  // namespace runner
