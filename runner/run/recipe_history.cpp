// The recipes of a run directory and whether its run is done (see recipe_history.h).
#include "runner/run/recipe_history.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

// Dotted key -> the value as YAML writes it (a list as "[a, b]"), in document order.
void flatten(const YAML::Node& n, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) {
      const std::string key = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter e;
  e.SetSeqFormat(YAML::Flow);
  e.SetMapFormat(YAML::Flow);
  e << n;
  out.emplace_back(prefix, n.IsNull() ? std::string("null") : std::string(e.c_str()));
}

std::vector<std::pair<std::string, std::string>> fields_of(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  try {
    flatten(YAML::Load(yaml), "", out);
  } catch (const YAML::Exception&) {
    out.clear();
  }
  return out;
}

}  // namespace

std::vector<RecipeChange> recipe_changes(const std::string& before_yaml, const std::string& after_yaml) {
  const auto before = fields_of(before_yaml), after = fields_of(after_yaml);
  std::map<std::string, std::string> was(before.begin(), before.end()), now(after.begin(), after.end());
  std::vector<RecipeChange> out;
  for (const auto& [k, v] : after) {
    auto it = was.find(k);
    if (it == was.end()) out.push_back({k, "(unset)", v});
    else if (it->second != v) out.push_back({k, it->second, v});
  }
  for (const auto& [k, v] : before)
    if (!now.count(k)) out.push_back({k, v, "(unset)"});
  return out;
}

std::string describe_change(const RecipeChange& c) { return fmt::format("{} {} -> {}", c.field, c.was, c.now); }

std::string stored_recipe_text(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "recipe.yaml", std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// The next free RUN_DIR/STEM.N.EXT, filled by `make` (which sets `ec` when it fails).
template <class Make>
std::string keep_numbered(const fs::path& dir, const std::string& stem, const std::string& ext, Make&& make) {
  std::error_code ec;
  for (int n = 1;; ++n) {
    const std::string name = fmt::format("{}.{}.{}", stem, n, ext);
    if (fs::exists(dir / name, ec)) continue;
    make(dir / name, ec);
    if (ec)
      throw UserError({(dir / name).string(), 0, 0}, fmt::format("cannot keep {}: {}", name, ec.message()),
                      "check the run directory's permissions and free space");
    return name;
  }
}

}  // namespace

std::string keep_numbered_copy(const std::string& run_dir, const std::string& stem, const std::string& ext) {
  const fs::path current = fs::path(run_dir) / (stem + "." + ext);
  std::error_code ec;
  if (!fs::exists(current, ec)) return "";
  return keep_numbered(run_dir, stem, ext, [&](const fs::path& to, std::error_code& e) { fs::copy_file(current, to, e); });
}

std::string keep_numbered_text(const std::string& run_dir, const std::string& stem, const std::string& ext,
                               const std::string& text) {
  return keep_numbered(run_dir, stem, ext, [&](const fs::path& to, std::error_code& e) {
    std::ofstream out(to, std::ios::binary);
    out << text;
    out.close();
    if (!out) e = std::make_error_code(std::errc::io_error);
  });
}

bool run_has_ended(const std::string& run_dir, int64_t last) {
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"summary\"") == std::string::npos && line.find("\"eval\"") == std::string::npos) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("summary", false) || (j.value("eval", false) && j.value("step", int64_t{-1}) == last)) return true;
    } catch (const nlohmann::json::exception&) {
      // a line torn by a kill
    }
  }
  return false;
}

}  // namespace runner
