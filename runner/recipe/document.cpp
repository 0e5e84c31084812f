// The recipe document: reading the text, --set overrides, and where every node was written.
//
// Design. yaml-cpp parses the text; the tree is then converted ONCE into a JSON value
// typed by the YAML 1.2 core schema (`8` is an integer, `'8'` a string, `yes` a string)
// while a side table remembers where every node was written. --set overrides edit that
// tree. schema.cpp then checks it against schemas/recipe.schema.json and walks its errors
// back to the side table, so every problem is reported as file:line:col with a fix. A
// syntax error stops the reading (what follows it cannot be trusted); everything after it
// is collected and reported in one pass.
// (valijson's own yaml-cpp adapter is not used: it sees every scalar as a string and
// throws YAML::BadConversion while checking `micro: eight`, so types cannot be checked.)

#include "runner/recipe/document.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace runner::recipe_detail {

// ---------------------------------------------------------------------------------------
// Small text helpers


std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Makes arbitrary bytes safe to print inside a message (control bytes as \xNN).
std::string printable(const std::string& s, size_t max_len) {
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
// Paths


std::string child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
std::string item_path(const std::string& parent, size_t i) { return parent + "[" + std::to_string(i) + "]"; }
std::string describe_path(const std::string& path) { return path.empty() ? "the recipe" : path; }

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool path_related(const std::string& a, const std::string& b) {
  const auto under = [](const std::string& x, const std::string& y) {  // x is y or lies under it
    return x == y || y.empty() || (x.size() > y.size() && x.compare(0, y.size(), y) == 0 && (x[y.size()] == '.' || x[y.size()] == '['));
  };
  return under(a, b) || under(b, a);
}

// ---------------------------------------------------------------------------------------
// Problems

void throw_problems(std::vector<Problem> ps) {
  std::stable_sort(ps.begin(), ps.end(), [](const Problem& a, const Problem& b) {
    return std::tie(a.rank, a.from_set, a.loc.line, a.loc.col) < std::tie(b.rank, b.from_set, b.loc.line, b.loc.col);
  });
  std::vector<UserError::Entry> all;
  for (const Problem& p : ps) {
    const bool repeated = std::any_of(all.begin(), all.end(), [&](const UserError::Entry& e) {
      return e.what == p.what && e.loc.str() == p.loc.str();
    });
    if (!repeated) all.push_back({p.loc, p.what, p.fix});
  }
  throw UserError(std::move(all));
}

// ---------------------------------------------------------------------------------------
// The document: a typed JSON tree plus where each node was written

const NodeInfo& Doc::info(const std::string& path) const {
  static const NodeInfo none;
  auto it = nodes.find(path);
  return it == nodes.end() ? none : it->second;
}
SourceLoc Doc::key_loc(const std::string& path) const {
  const NodeInfo& i = info(path);
  if (i.from_set) return kSetLoc;
  return SourceLoc{file, i.key_line, i.key_col};
}
SourceLoc Doc::value_loc(const std::string& path) const {
  const NodeInfo& i = info(path);
  if (i.from_set) return kSetLoc;
  if (i.val_line > 0) return SourceLoc{file, i.val_line, i.val_col};
  return SourceLoc{file, i.key_line, i.key_col};
}
void Doc::erase_subtree(const std::string& path) {
  for (auto it = nodes.begin(); it != nodes.end();) {
    const std::string& p = it->first;
    const bool under = p == path || (p.size() > path.size() && p.compare(0, path.size(), path) == 0 &&
                                     (p[path.size()] == '.' || p[path.size()] == '['));
    it = under ? nodes.erase(it) : std::next(it);
  }
}

namespace {

constexpr int kMaxDepth = 16;  // the schema is 4 levels deep; anything far deeper is not a recipe
// YAML aliases (*name) repeat what an anchor (&name) holds, and nested ones multiply: nine
// levels of them expand to billions of values from a few lines. A recipe is small (the largest
// shipped one holds under 200 values), so converting stops at this many.
constexpr size_t kMaxValues = 10000;
thread_local size_t g_values = 0;  // values converted so far in this document (or --set value)

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
// yaml-cpp nodes -> the JSON tree


int line_of(const YAML::Mark& m) { return m.line >= 0 ? m.line + 1 : 0; }
int col_of(const YAML::Mark& m) { return m.column >= 0 ? m.column + 1 : 0; }

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
  if (++g_values > kMaxValues)
    throw UserError(info.from_set ? kSetLoc : SourceLoc{doc.file, line_of(n.Mark()), col_of(n.Mark())},
                    "the recipe expands to more than " + std::to_string(kMaxValues) +
                        " values (YAML aliases *name repeat the anchor &name, and nested aliases multiply)",
                    "a recipe is small: write the values out instead of through aliases");
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
      if (doc.skipped.count(cpath)) continue;  // an unknown key: reported, its value never expanded
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

}  // namespace

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
  doc.problems = unknown_key_problems(top, file);  // before any alias is expanded: the user's own spelling is reported
  for (const Problem& p : doc.problems) doc.skipped.insert(p.path);
  try {
    g_values = 0;
    doc.root = convert(top, "", ri, 0, doc);
  } catch (const YAML::Exception& e) {  // not expected after a successful parse; never let it escape raw
    throw UserError(SourceLoc{file, line_of(e.mark), col_of(e.mark)}, "could not read this YAML node",
                    syntax_hint(e.msg));
  } catch (const UserError& e) {
    // A structural problem (a duplicate or dotted key, nesting) stops the reading; the unknown
    // keys found before it are independent of it and reported with it.
    if (doc.problems.empty()) throw;
    doc.problems.push_back(Problem{0, e.loc(), false, e.problem(), e.fix(), ""});
    throw_problems(doc.problems);
  }
  return doc;
}

// ---------------------------------------------------------------------------------------
// --set overrides: "a.b.c=value", the value parsed as YAML (so lists and mappings work)

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
  g_values = 0;
  *cur = convert(value, cur_path, set_info, 1, doc);
}

}  // namespace runner::recipe_detail
