// Inside the recipe loader (runner/recipe/*.cpp only): the YAML document as a typed JSON
// tree plus where each node was written, and the helpers its messages share.
//
// load_recipe_text() = parse_document() (unknown keys first, then the bounded conversion) ->
// apply_override() per --set ->
// validate_against_schema() -> fill the structs (recipe.cpp) -> validate_recipe().
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runner/errors.h"

namespace YAML {
class Node;
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
// Validates the document against schemas/recipe.schema.json; throws the first problem
// (in file order; missing keys last) as file:line:col with a fix.
void validate_against_schema(const Doc& doc);
// The first unknown key (in file order) of the parsed YAML, before anything is converted:
// parse_document calls it first, so an unknown key answers at once even beside YAML aliases
// that would expand past the value cap. Walks only the mappings the schema describes (bounded
// by the schema, never through an alias of a list or an unknown key's value). Throws it.
void check_unknown_keys(const YAML::Node& top, const std::string& file);
std::string type_phrase(const std::string& schema_type);  // "integer" -> "an integer"
std::string shown(const json& v, const NodeInfo& info);    // a value as written, for messages

}  // namespace runner::recipe_detail
