// The recipe: load_recipe (text -> document -> --set -> schema -> structs -> cross-field
// checks) and recipe_to_yaml (structs -> the resolved YAML kept in run directories and in
// every checkpoint).
//
// Filling the structs and writing them back are two visitors over the one list of keys in
// runner/recipe/fields.h; the document and its messages live in document.cpp, the schema
// check in schema.cpp, the cross-field rules in validate.cpp.

// GCC 12 reports a false -Wrestrict inside std::string's operator+ (GCC bug 105329); the
// pragma must precede <string> to cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "runner/recipe/recipe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runner/recipe/document.h"
#include "runner/recipe/fields.h"
#include "runner/recipe/paths.h"

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

using namespace recipe_detail;

// ---------------------------------------------------------------------------------------
// Filling the structs: a visitor over fields.h that reads one section of the validated
// tree. Types were checked by the schema; the checks here only guard against a schema
// that drifted from fields.h, and still say where. A key not written keeps the struct's
// default.

class Reader {
 public:
  Reader(const Doc& doc, const json& section, std::string path) : doc_(doc), section_(section), path_(std::move(path)) {}

  void operator()(const char* key, int64_t& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer()) wrong(child_path(path_, key), "integer", *v);
      out = v->get<int64_t>();
    }
  }
  void operator()(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) wrong(child_path(path_, key), "number", *v);
      out = v->get<double>();
    }
  }
  void operator()(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) wrong(child_path(path_, key), "boolean", *v);
      out = v->get<bool>();
    }
  }
  void operator()(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) wrong(child_path(path_, key), "string", *v);
      out = v->get<std::string>();
    }
  }
  template <RecipeEnum E>
  void operator()(const char* key, E& out) const {
    if (const json* v = find(key)) out = word<E>(child_path(path_, key), *v);
  }
  void operator()(const char* key, std::vector<int64_t>& out) const {
    if (const json* v = list(key)) {
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_number_integer()) wrong(item_path(child_path(path_, key), i), "integer", (*v)[i]);
        out.push_back((*v)[i].get<int64_t>());
      }
    }
  }
  template <RecipeEnum E>
  void operator()(const char* key, std::vector<E>& out) const {
    if (const json* v = list(key)) {
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) out.push_back(word<E>(item_path(child_path(path_, key), i), (*v)[i]));
    }
  }

  template <class Config>
  void section(const char* key, Config& out) const {
    if (const json* s = subsection(key)) {
      const Reader sub(doc_, *s, child_path(path_, key));
      visit(sub, out);
    }
  }
  // A list of sections (data.mix): each item read like a section, at path key[i].
  template <class Config>
  void list(const char* key, std::vector<Config>& out) const {
    if (const json* v = list(key)) {
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        const std::string ip = item_path(child_path(path_, key), i);
        if (!(*v)[i].is_object()) wrong(ip, "object", (*v)[i]);
        Config c;
        const Reader sub(doc_, (*v)[i], ip);
        visit(sub, c);
        out.push_back(std::move(c));
      }
    }
  }
  // An optional section exists when written (even as `inference: {}`).
  template <class Config>
  void section(const char* key, std::optional<Config>& out) const {
    if (const json* s = subsection(key)) {
      Config c;
      const Reader sub(doc_, *s, child_path(path_, key));
      visit(sub, c);
      out = c;
    }
  }

 private:
  const json* find(const char* key) const { return section_.contains(key) ? &section_[key] : nullptr; }
  const json* list(const char* key) const {
    const json* v = find(key);
    if (v && !v->is_array()) wrong(child_path(path_, key), "array", *v);
    return v;
  }
  const json* subsection(const char* key) const {
    const json* s = find(key);
    if (s && !s->is_object()) wrong(child_path(path_, key), "object", *s);
    return s;
  }
  template <RecipeEnum E>
  E word(const std::string& path, const json& v) const {
    if (!v.is_string()) wrong(path, "string", v);
    if (auto e = parse_enum<E>(v.get<std::string>())) return *e;
    std::vector<std::string> words;
    for (const auto& [value, w] : enum_names(E{})) words.emplace_back(w);
    throw UserError(doc_.value_loc(path), path + " must be one of " + join(words, ", ") + ", got " + shown(v, doc_.info(path)),
                    "fix the value (and check that schemas/recipe.schema.json matches this build)");
  }
  [[noreturn]] void wrong(const std::string& path, const std::string& type, const json& v) const {
    throw UserError(doc_.value_loc(path), path + " must be " + type_phrase(type) + ", got " + shown(v, doc_.info(path)),
                    "fix the value (and check that schemas/recipe.schema.json matches this build)");
  }

  const Doc& doc_;
  const json& section_;
  std::string path_;
};

// Removes the value at `path` ("batch.micro"; a list item's whole list) from the tree.
void drop_value(json& root, const std::string& path) {
  const std::string p = path.substr(0, path.find('['));
  if (p.empty()) return;  // the recipe itself: parse_document already made it a mapping
  json* parent = &root;
  size_t start = 0;
  for (size_t dot = p.find('.'); dot != std::string::npos; start = dot + 1, dot = p.find('.', start)) {
    const std::string seg = p.substr(start, dot - start);
    if (!parent->is_object() || !parent->contains(seg)) return;
    parent = &(*parent)[seg];
  }
  if (parent->is_object()) parent->erase(p.substr(start));
}

void fill(const Doc& doc, Recipe& r) {
  const Reader top(doc, doc.root, "");
  visit(top, r);

  // Checkpoint cadence follows from what was written: every_minutes alone means minutes;
  // nothing at all means one checkpoint at the end of training.
  const auto written = [&](const char* p) { return doc.nodes.count(p) > 0; };
  CheckpointConfig& c = r.checkpoint;
  if (!written("checkpoint.cadence")) {
    if (written("checkpoint.every_minutes") && !written("checkpoint.every_steps")) c.cadence = CheckpointCadence::minutes;
    else if (!written("checkpoint.every_steps") && !written("checkpoint.every_minutes")) c.every_steps = r.train.steps;
  }

  for (const auto& [path, info] : doc.nodes) {
    if (path.empty()) continue;
    r.locs[path] = info.from_set ? kSetLoc : SourceLoc{doc.file, info.key_line, info.key_col};
  }
  // The data room reports a mix entry's missing or mismatched dataset there (it sees no locs).
  for (size_t i = 0; i < r.data.mix.size(); ++i) r.data.mix[i].loc = r.loc(item_path("data.mix", i) + ".path");
}

// ---------------------------------------------------------------------------------------
// Writing the resolved recipe: a visitor over fields.h, two spaces per level, every
// key written (defaults included), lists in flow style.

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

class Writer {
 public:
  Writer(std::string& out, int indent) : out_(out), indent_(indent) {}

  void operator()(const char* key, const std::string& v) { kv(key, yaml_string(v)); }
  void operator()(const char* key, int64_t v) { kv(key, std::to_string(v)); }
  void operator()(const char* key, double v) { kv(key, yaml_double(v)); }
  void operator()(const char* key, bool v) { kv(key, v ? "true" : "false"); }
  template <RecipeEnum E>
  void operator()(const char* key, E v) { kv(key, yaml_string(to_string(v))); }
  void operator()(const char* key, const std::vector<int64_t>& v) {
    std::vector<std::string> s;
    for (int64_t x : v) s.push_back(std::to_string(x));
    kv(key, "[" + join(s, ", ") + "]");
  }
  template <RecipeEnum E>
  void operator()(const char* key, const std::vector<E>& v) {
    std::vector<std::string> s;
    for (E x : v) s.push_back(yaml_string(to_string(x)));
    kv(key, "[" + join(s, ", ") + "]");
  }

  template <class Config>
  void section(const char* key, const Config& c) {
    line(std::string(key) + ":");
    Writer sub(out_, indent_ + 1);
    visit(sub, c);
  }
  template <class Config>
  void section(const char* key, const std::optional<Config>& c) {
    if (c) section(key, *c);
  }
  // A list of sections: "- " before each item's first key, its other keys under it.
  template <class Config>
  void list(const char* key, const std::vector<Config>& items) {
    if (items.empty()) return kv(key, "[]");
    line(std::string(key) + ":");
    for (const Config& c : items) {
      std::string item;
      Writer sub(item, 0);
      visit(sub, c);
      const std::string pad(static_cast<size_t>(indent_ + 1) * 2, ' ');
      for (size_t at = 0, first = 1; at < item.size(); first = 0) {
        const size_t nl = item.find('\n', at);
        out_ += pad + (first ? "- " : "  ") + item.substr(at, nl - at) + "\n";
        at = nl + 1;
      }
    }
  }

 private:
  void kv(const char* key, const std::string& v) { line(std::string(key) + ": " + v); }
  void line(const std::string& s) { out_ += std::string(static_cast<size_t>(indent_) * 2, ' ') + s + "\n"; }

  std::string& out_;
  int indent_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API

Recipe load_recipe_text(const std::string& text, const std::string& display_name,
                        const std::vector<std::string>& overrides) {
  Doc doc = parse_document(text, display_name);
  for (const std::string& o : overrides) apply_override(doc, o);
  // `parallel: auto` is parallel.auto: true with nothing else fixed (runner/perf/search.h).
  if (doc.root.contains("parallel") && doc.root["parallel"] == "auto") {
    doc.root["parallel"] = json{{"auto", true}};
    doc.nodes["parallel.auto"] = doc.nodes["parallel"];
  }
  std::vector<Problem> problems = doc.problems;
  // Every independent problem in one pass, so a user fixes them all at once: the values with a problem are dropped
  // so that the structs can still be filled (with defaults there), and the cross-field rules
  // that read them stay quiet.
  std::set<std::string> tainted;
  for (Problem& p : schema_problems(doc)) {
    // A required key missing where an unknown key's fix points (n_embd -> model.d_model) is
    // that same mistake: its line already says what to write.
    const bool follows = p.rank == 1 && std::any_of(problems.begin(), problems.end(), [&](const Problem& u) {
      return !u.means.empty() && u.means == p.path;
    });
    if (follows) tainted.insert(p.path);
    else problems.push_back(std::move(p));
  }
  for (const Problem& p : problems) {
    tainted.insert(p.path);
    drop_value(doc.root, p.path);
  }
  Recipe r;
  r.source_file = display_name;
  r.source_text = text;
  if (!overrides.empty()) {
    if (!r.source_text.empty() && r.source_text.back() != '\n') r.source_text += '\n';
    for (const std::string& o : overrides) r.source_text += "# --set " + o + "\n";
  }
  fill(doc, r);
  for (Problem& p : cross_field_problems(r, tainted)) problems.push_back(std::move(p));
  if (!problems.empty()) throw_problems(std::move(problems));
  resolve_recipe_paths(r, "");  // the --set paths (the text's own are resolved by load_recipe)
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
  Recipe r = load_recipe_text(ss.str(), path, overrides);
  resolve_recipe_paths(r, path);  // relative inputs are read beside the recipe (runner/recipe/paths.h)
  return r;
}


std::string recipe_to_yaml(const Recipe& r) {
  std::string out = "# The recipe as resolved by runner: every default filled in.\n";
  Writer w(out, 0);
  visit(w, r);
  return out;
}

}  // namespace runner
