// The recipe's path fields made absolute (see paths.h).
#include "runner/recipe/paths.h"

#include <filesystem>
#include <system_error>
#include <vector>

namespace fs = std::filesystem;

namespace runner {

namespace {

std::string absolute_from(const fs::path& base, const std::string& p) {
  std::error_code ec;
  fs::path out = fs::path(p).is_absolute() ? fs::path(p) : base / p;
  if (!out.is_absolute()) out = fs::absolute(out, ec);
  return (ec ? fs::path(p) : out.lexically_normal()).string();
}

}  // namespace

void resolve_recipe_paths(Recipe& r, const std::string& recipe_file) {
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (ec) return;  // no working directory (removed under us): the paths stay as written
  const fs::path recipe_dir = recipe_file.empty() ? fs::path() : fs::absolute(fs::path(recipe_file), ec).parent_path();
  struct Field {
    const char* key;
    std::string* value;
    bool input;
  };
  std::vector<Field> fields = {Field{"data.path", &r.data.path, true}, Field{"data.val_path", &r.data.val_path, true},
                               Field{"model.init_from", &r.model.init_from, true},
                               Field{"hardware.profile", &r.hardware.profile, true},
                               Field{"train.run_dir", &r.train.run_dir, false},
                               Field{"checkpoint.dir", &r.checkpoint.dir, false}};
  std::vector<std::string> mix_keys;  // kept alive: Field holds a pointer to the key
  for (size_t i = 0; i < r.data.mix.size(); ++i) mix_keys.push_back("data.mix[" + std::to_string(i) + "].path");
  for (size_t i = 0; i < r.data.mix.size(); ++i) fields.push_back(Field{mix_keys[i].c_str(), &r.data.mix[i].path, true});
  // A tokenizer is a directory or file too, except the built-in name "byte".
  if (r.data.tokenizer != "byte") fields.push_back(Field{"data.tokenizer", &r.data.tokenizer, true});
  for (const Field& f : fields) {
    if (f.value->empty() || fs::path(*f.value).is_absolute()) continue;
    const bool from_set = r.loc(f.key).file == "--set";
    if (!from_set && recipe_file.empty()) continue;
    *f.value = absolute_from(f.input && !from_set ? recipe_dir : cwd, *f.value);
  }
}

}  // namespace runner
