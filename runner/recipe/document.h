// Inside the recipe loader (runner/recipe/*.cpp only): the YAML document as a typed JSON
// tree plus where each node was written, and the helpers its messages share.
//
// load_recipe_text() = parse_document() (unknown keys first, then the bounded conversion) ->
// apply_override() per --set -> schema_problems() -> the nodes with a problem dropped (their
// defaults stand in) -> fill the structs (recipe.cpp) -> cross_field_problems() on the fields
// without one -> every problem thrown at once (throw_problems).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runner/errors.h"

namespace YAML {
class Node;
}
namespace runner {
struct Recipe;
}

namespace runner::recipe_detail {

using json = nlohmann::json;

inline const SourceLoc kSetLoc{"--set", 0, 0};

// ---- text helpers (document.cpp)
std::string lower(std::string s);
std::string join(const std::vector<std::string>& v, const std::string& sep);
// Arbitrary bytes made safe to print inside a message (control bytes as \xNN), cut at max_len.
std::string printable(const std::string& s, size_t max_len = 40);
// Shortest text that reads back as the same double; plain digits unless very small or large.
std::string format_number(double v);
std::string format_json_scalar(const json& v);

// ---- paths: "batch.micro", list items "parallel.stage_layers[1]"
std::string child_path(const std::string& parent, const std::string& key);
std::string item_path(const std::string& parent, size_t i);
std::string describe_path(const std::string& path);  // "the recipe" for the root
bool is_index(const std::string& s);

// ---- problems: every independent one is collected, then all are thrown together (a user fixes them in one pass)
struct Problem {
  int rank = 0;  // 0: a problem with a value or key; 1: a missing key (reported after the others)
  SourceLoc loc;
  bool from_set = false;
  std::string what, fix;
  std::string path;  // the field it is about ("model.n_heads"); checks that read it stay quiet
  std::string means; // an unknown key: the key path its fix points to (a missing key there follows from it)
};
// Sorted in file order (missing keys last, --set after the file), repeats dropped, thrown as
// one UserError. `ps` must not be empty.
[[noreturn]] void throw_problems(std::vector<Problem> ps);
// Whether field path `a` is `b`, lies under it, or holds it ("model" and "model.n_heads",
// "parallel.stage_layers" and "parallel.stage_layers[1]").
bool path_related(const std::string& a, const std::string& b);

// ---- the document
struct NodeInfo {
  int key_line = 0, key_col = 0;  // its key (for list items: the item itself); 1-based
  int val_line = 0, val_col = 0;  // its value; 0 when no value was written
  std::string raw;                // a scalar as written, for messages
  bool from_set = false;          // written by a --set override
};

struct Doc {
  std::string file;
  json root;
  std::map<std::string, NodeInfo> nodes;  // display path -> where it was written
  std::vector<Problem> problems;          // found while reading (unknown keys); not yet thrown
  std::set<std::string> skipped;          // unknown keys' paths: reported, never converted

  const NodeInfo& info(const std::string& path) const;
  SourceLoc key_loc(const std::string& path) const;
  SourceLoc value_loc(const std::string& path) const;
  void erase_subtree(const std::string& path);
};

// Reads the text as one YAML document of the recipe's shape (a mapping); scalars typed by
// the YAML 1.2 core schema. Throws UserError at the first syntax problem.
Doc parse_document(const std::string& text, const std::string& file);
// Applies one --set "a.b.c=value" (the value parsed as YAML) to the tree.
void apply_override(Doc& doc, const std::string& spec);

// ---- the schema (schema.cpp)
// Checks the document against schemas/recipe.schema.json; every problem, each at the
// file:line:col where it was written, with its fix (one per node: what follows from it is
// not repeated).
std::vector<Problem> schema_problems(const Doc& doc);
// The unknown keys of the parsed YAML, before anything is converted: parse_document calls it
// first and never converts their values, so YAML aliases under an unknown key are never
// expanded. Walks only the mappings the schema describes (bounded by the schema, never
// through an alias of a list or an unknown key's value).
std::vector<Problem> unknown_key_problems(const YAML::Node& top, const std::string& file);

// ---- the cross-field rules (validate.cpp): every problem among the rules whose fields are
// not `tainted` (fields that already have a problem, or were missing: their values are
// defaults, so a rule reading them would only echo that problem).
std::vector<Problem> cross_field_problems(const Recipe& r, const std::set<std::string>& tainted);
// A key another training tool uses for one of ours (foreign_keys.cpp): nanoGPT's block_size
// is model.seq_len. Null when `name` is not such a key.
struct ForeignKey {
  std::string_view name, tools;  // the foreign key, lower case; the tools that use it
  std::string_view ours;         // our key path
  std::string_view note;         // how to convert the value, when it is not the same number
};
const ForeignKey* foreign_key(const std::string& name);

std::string type_phrase(const std::string& schema_type);  // "integer" -> "an integer"
std::string shown(const json& v, const NodeInfo& info);    // a value as written, for messages

}  // namespace runner::recipe_detail
