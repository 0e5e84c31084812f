// The recipe as the report shows it, see recipe_view.h.
#include "runner/report/recipe_view.h"

#include <sstream>
#include <utility>

#include <yaml-cpp/yaml.h>

namespace runner::report {

namespace {

std::string scalar(const YAML::Node& root, const char* section, const char* key, const std::string& def) {
  try {
    const YAML::Node n = root[section][key];
    return n && n.IsScalar() ? n.as<std::string>() : def;
  } catch (const YAML::Exception&) {
    return def;
  }
}

// The values the rules read.
struct Settings {
  std::string kind = "addition", val_path, compute = "fp32", scale_mode = "dynamic", pp = "1";
};

Settings settings(const YAML::Node& root) {
  Settings s;
  s.kind = scalar(root, "data", "kind", s.kind);
  s.val_path = scalar(root, "data", "val_path", "");
  s.compute = scalar(root, "precision", "compute", s.compute);
  try {
    const YAML::Node m = root["precision"]["loss_scale"]["mode"];
    if (m && m.IsScalar()) s.scale_mode = m.as<std::string>();
  } catch (const YAML::Exception&) {
  }
  s.pp = scalar(root, "parallel", "pp", s.pp);
  return s;
}

// Why the field at `path` does not apply to this run, or "" when it does.
std::string not_applying(const std::string& path, const Settings& s) {
  const bool file = s.kind != "addition";
  if (path == "data.digits" && s.kind != "addition") return "data.kind is " + s.kind;
  if ((path == "data.path" || path == "data.val_fraction" || path == "data.val_path") && !file)
    return "data.kind addition reads no file";
  if (path == "data.val_path" && s.val_path.empty()) return "empty: the last data.val_fraction of data.path is held out";
  if (path == "data.val_fraction" && !s.val_path.empty()) return "data.val_path is given";
  if (path == "data.dataset" && s.kind != "hdf5") return "data.kind is " + s.kind + ", not hdf5";
  if (path == "precision.loss_scale" && s.compute != "fp16") return "precision.compute is " + s.compute + ": no loss scaling";
  if ((path == "parallel.schedule" || path == "parallel.virtual_stages" || path == "parallel.stage_layers") && s.pp == "1")
    return "parallel.pp is 1";
  return "";
}

size_t indent_of(const std::string& line) { return line.find_first_not_of(' '); }

}  // namespace

RecipeView recipe_view(const std::string& text) {
  RecipeView v;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception&) {
    v.text = text;  // shown as it is
    return v;
  }
  if (!root.IsMap()) {
    v.text = text;
    return v;
  }
  const Settings s = settings(root);
  v.loss_scaling = s.compute == "fp16" && s.scale_mode != "none";
  std::vector<std::pair<size_t, std::string>> parents;  // (indent, key) of the enclosing mappings
  size_t skip_below = std::string::npos;                // inside a left-out block: lines indented deeper go too
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t ind = indent_of(line);
    if (ind == std::string::npos || line[ind] == '#') {  // blank or a comment
      if (skip_below == std::string::npos) v.text += line + "\n";
      continue;
    }
    if (skip_below != std::string::npos && ind > skip_below) continue;
    skip_below = std::string::npos;
    const size_t colon = line.find(':', ind);
    if (line.compare(ind, 2, "- ") == 0 || colon == std::string::npos) {  // a list item or a continuation
      v.text += line + "\n";
      continue;
    }
    while (!parents.empty() && parents.back().first >= ind) parents.pop_back();
    std::string path;
    for (const auto& p : parents) path += p.second + ".";
    path += line.substr(ind, colon - ind);
    if (const std::string why = not_applying(path, s); !why.empty()) {
      v.left_out.push_back(path + " (" + why + ")");
      skip_below = ind;
      continue;
    }
    parents.emplace_back(ind, line.substr(ind, colon - ind));
    v.text += line + "\n";
  }
  return v;
}

}  // namespace runner::report
