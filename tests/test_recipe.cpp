// Recipe loading: every malformed recipe in tests/bad_recipes/ fails at the line:col its
// `# expect:` header names, with a fix and no C++ internals in the message; shipped
// recipes load; --set overrides; the resolved YAML round-trips; defaults and locations;
// the schema and the declared fields (runner/recipe/fields.h) agree key for key, in type,
// enum words and defaults; garbage input never crashes.
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "runner/recipe/fields.h"
#include "runner/recipe/recipe.h"
#include "tests/support/env.h"
#include "tests/support/errors.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

using namespace runner;
namespace fs = std::filesystem;

namespace {

const std::string kMinimal =
    "name: minimal\n"
    "model:\n"
    "  vocab_size: 256\n"
    "  seq_len: 64\n"
    "  d_model: 128\n"
    "  n_layers: 2\n"
    "  n_heads: 4\n";

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using test_support::expect_user_error;

// What a message must never show: C++ or library internals.
void check_clean(const std::string& msg) {
  for (const char* bad : {"bad_cast", "yaml-cpp", "YAML::", "std::", "exception", "nlohmann", "valijson",
                          "basic_string", "what()", "Failed to validate", "BadConversion"})
    CHECK_MESSAGE(msg.find(bad) == std::string::npos, "message leaks '" << bad << "': " << msg);
}

// Dotted paths of every leaf key in a YAML mapping (lists count as leaves).
void leaf_paths(const YAML::Node& n, const std::string& prefix, std::set<std::string>& out) {
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string p = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
    if (it->second.IsMap()) leaf_paths(it->second, p, out);
    else out.insert(p);
  }
}

const nlohmann::json& schema() {
  static const nlohmann::json s = nlohmann::json::parse(read(fs::path(RUNNER_SOURCE_DIR) / "schemas" / "recipe.schema.json"));
  return s;
}

void schema_leaves(const nlohmann::json& sub, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  for (auto it = sub["properties"].begin(); it != sub["properties"].end(); ++it) {
    const std::string p = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().value("type", "") == "object") schema_leaves(it.value(), p, out);
    else out[p] = it.value();
  }
}

// Walks the declared fields (fields.h) of a default Recipe against a schema, collecting
// every disagreement: a declared key the schema lacks, a different type, different enum
// words, a different default, a schema property nobody declared, or a closed set of words
// that is still a std::string in C++.
class SchemaCheck {
 public:
  using json = nlohmann::json;

  // The schema properties that may stay std::string although the schema lists words.
  static bool open_set(const std::string& path) { return path == "hardware.device"; }

  static std::vector<std::string> run(const json& schema) {
    SchemaCheck c(schema, "");
    const Recipe defaults;
    visit(c, defaults);
    std::set<std::string> in_schema;
    all_paths(schema, "", in_schema);
    for (const std::string& p : in_schema)
      if (!c.declared_->count(p)) c.problems_->push_back(p + ": in the schema but not declared in fields.h");
    return *c.problems_;
  }

  void operator()(const char* key, const int64_t& v) { leaf(key, "integer", json(v)); }
  void operator()(const char* key, const double& v) { leaf(key, "number", json(v)); }
  void operator()(const char* key, const bool& v) { leaf(key, "boolean", json(v)); }
  void operator()(const char* key, const std::string& v) {
    const json* s = leaf(key, "string", json(v));
    if (s && s->contains("enum") && !open_set(at(key)))
      problem(key, "the schema lists words " + (*s)["enum"].dump() + ": make it an enum (runner/recipe/enums.h)");
  }
  template <RecipeEnum E>
  void operator()(const char* key, const E& v) {
    if (const json* s = leaf(key, "string", json(to_string(v)))) same_words<E>(key, *s);
  }
  void operator()(const char* key, const std::vector<int64_t>& v) {
    if (const json* s = leaf(key, "array", json(v))) item_type(key, *s, "integer");
  }
  template <RecipeEnum E>
  void operator()(const char* key, const std::vector<E>& v) {
    std::vector<std::string> words;
    for (E e : v) words.push_back(to_string(e));
    if (const json* s = leaf(key, "array", json(words))) {
      item_type(key, *s, "string");
      if (s->contains("items")) same_words<E>(key, (*s)["items"]);
    }
  }
  template <class Config>
  void section(const char* key, const Config& c) {
    const json* s = leaf(key, "object", json());
    if (!s) return;
    SchemaCheck sub(*s, at(key), declared_, problems_);
    visit(sub, c);
  }
  template <class Config>
  void section(const char* key, const std::optional<Config>&) {
    section(key, Config{});
  }
  // A list of sections (data.mix): an array whose items are objects with the section's keys.
  template <class Config>
  void list(const char* key, const std::vector<Config>& v) {
    const json* s = leaf(key, "array", json::array());
    if (!s) return;
    if (!v.empty()) problem(key, "a list of sections defaults to empty");
    if (!s->contains("items") || (*s)["items"].value("type", "") != "object") return problem(key, "the schema's items must be objects");
    SchemaCheck sub((*s)["items"], at(key) + "[]", declared_, problems_);
    const Config item;
    visit(sub, item);
  }

 private:
  SchemaCheck(const json& object, std::string path, std::shared_ptr<std::set<std::string>> declared = nullptr,
              std::shared_ptr<std::vector<std::string>> problems = nullptr)
      : object_(object), path_(std::move(path)),
        declared_(declared ? declared : std::make_shared<std::set<std::string>>()),
        problems_(problems ? problems : std::make_shared<std::vector<std::string>>()) {}

  static void all_paths(const json& object, const std::string& prefix, std::set<std::string>& out) {
    if (object.contains("items")) all_paths(object["items"], prefix + "[]", out);
    if (!object.contains("properties")) return;
    for (auto it = object["properties"].begin(); it != object["properties"].end(); ++it) {
      const std::string p = prefix.empty() ? it.key() : prefix + "." + it.key();
      out.insert(p);
      all_paths(it.value(), p, out);
    }
  }
  std::string at(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  void problem(const char* key, const std::string& what) { problems_->push_back(at(key) + ": " + what); }

  // The key's property: declared, of `type`, with `value` as its default where it states one.
  const json* leaf(const char* key, const std::string& type, const json& value) {
    declared_->insert(at(key));
    if (!object_.contains("properties") || !object_["properties"].contains(key)) {
      problem(key, "declared in fields.h but not in the schema");
      return nullptr;
    }
    const json& s = object_["properties"][key];
    if (s.value("type", "") != type) problem(key, "fields.h says " + type + ", the schema " + s.value("type", "(none)"));
    if (s.contains("default") && type != "object" && s["default"] != value)
      problem(key, "default " + value.dump() + " in recipe.h, " + s["default"].dump() + " in the schema");
    return &s;
  }
  void item_type(const char* key, const json& s, const std::string& type) {
    if (!s.contains("items") || s["items"].value("type", "") != type) problem(key, "the schema's items must be " + type);
  }
  template <RecipeEnum E>
  void same_words(const char* key, const json& s) {
    std::set<std::string> ours, theirs;
    for (const auto& [value, word] : enum_names(E{})) ours.emplace(word);
    if (s.contains("enum"))
      for (const json& w : s["enum"]) theirs.insert(w.is_string() ? w.get<std::string>() : w.dump());
    if (ours != theirs)
      problem(key, "enum words " + json(ours).dump() + " in enums.h, " + json(theirs).dump() + " in the schema");
  }

  const json& object_;
  std::string path_;
  std::shared_ptr<std::set<std::string>> declared_;
  std::shared_ptr<std::vector<std::string>> problems_;
};

}  // namespace

TEST_CASE("every bad recipe fails where its '# expect:' header says, with a fix") {
  const fs::path dir = fs::path(RUNNER_TEST_DIR) / "bad_recipes";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 25);

  const std::regex header(R"(^# expect: (\d+):(\d+): (.+)$)");
  for (const fs::path& f : files) {
    INFO("recipe: " << f.filename().string());
    std::string text = read(f);
    const std::string first = text.substr(0, text.find('\n'));
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_match(first, m, header), "first line must be '# expect: LINE:COL: SUBSTRING'");
    const int line = std::stoi(m[1]), col = std::stoi(m[2]);
    const std::string want = m[3];

    const UserError e = expect_user_error([&] { load_recipe(f.string()); });
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(e.loc().file == f.string());
    CHECK(e.loc().line == line);
    CHECK(e.loc().col == col);
    CHECK(msg.find(want) != std::string::npos);
    const std::string prefix = f.string() + ":" + std::to_string(line) + ":" + std::to_string(col) + ": ";
    CHECK(msg.rfind(prefix, 0) == 0);
    CHECK(msg.find("; ") != std::string::npos);
    CHECK(!e.fix().empty());
    check_clean(msg);
  }
}

TEST_CASE("every shipped recipe loads and round-trips") {
  const fs::path dir = fs::path(RUNNER_SOURCE_DIR) / "recipes";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    INFO("recipe: " << e.path().string());
    ++n;
    Recipe r;
    try {
      r = load_recipe(e.path().string());
    } catch (const UserError& err) {
      FAIL(err.what());
    }
    CHECK(r.name == e.path().stem().string());
    CHECK(read(e.path()).rfind("# yaml-language-server: $schema=../schemas/recipe.schema.json", 0) == 0);
    const std::string y = recipe_to_yaml(r);
    CHECK(recipe_to_yaml(load_recipe_text(y, "resolved.yaml")) == y);
  }
  CHECK(n >= 5);

  const Recipe q = load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml");
  CHECK(q.model.vocab_size == 256);
  CHECK(q.data.kind == DataKind::addition);
  CHECK(q.hardware.device == "cpu");
  CHECK(load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/llama-7b-8xh100.yaml").model.mlp_hidden() == 11008);
  CHECK(load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/llama-70b-64gpu.yaml").model.mlp_hidden() == 28672);
  CHECK(load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/gpt2-124m.yaml").model.mlp_hidden() == 3072);
}

TEST_CASE("defaults are filled from the structs and agree with the schema") {
  const Recipe r = load_recipe_text(kMinimal, "min.yaml");
  const Recipe d;
  CHECK(r.model.mlp_ratio == d.model.mlp_ratio);
  CHECK(r.model.norm == Norm::layernorm);
  CHECK(r.optimizer.lr == d.optimizer.lr);
  CHECK(r.optimizer.schedule.kind == LrSchedule::cosine);
  CHECK(r.precision.loss_scale.growth_interval == d.precision.loss_scale.growth_interval);
  CHECK(r.train.steps == 100);
  CHECK(r.data.kind == DataKind::addition);
  CHECK(!r.inference.has_value());
  // Nothing about checkpoints written: one checkpoint at the end of training.
  CHECK(r.checkpoint.cadence == CheckpointCadence::steps);
  CHECK(r.checkpoint.every_steps == r.train.steps);
  CHECK(r.source_file == "min.yaml");
  CHECK(r.source_text == kMinimal);

  // Every schema "default" equals what the loader fills in from recipe.h.
  const YAML::Node resolved = YAML::Load(recipe_to_yaml(load_recipe_text(kMinimal + "inference: {}\n", "min.yaml")));
  std::map<std::string, nlohmann::json> leaves;
  schema_leaves(schema(), "", leaves);
  for (const auto& [path, sub] : leaves) {
    if (!sub.contains("default") || path == "checkpoint.every_steps") continue;
    if (path.rfind("model.", 0) == 0 && std::string("vocab_size seq_len d_model n_layers n_heads").find(path.substr(6)) != std::string::npos)
      continue;  // written by the minimal recipe
    INFO("schema default of " << path);
    // Walk with const Nodes: yaml-cpp's Node::operator= writes through to the tree.
    std::stringstream parts(path);
    std::string part;
    std::vector<YAML::Node> chain{resolved};
    while (std::getline(parts, part, '.')) {
      const YAML::Node& parent = chain.back();
      chain.push_back(parent[part]);
    }
    const YAML::Node n = chain.back();
    REQUIRE(n.IsDefined());
    const nlohmann::json& def = sub["default"];
    if (def.is_boolean()) CHECK(n.as<bool>() == def.get<bool>());
    else if (def.is_number_integer()) CHECK(n.as<int64_t>() == def.get<int64_t>());
    else if (def.is_number()) CHECK(n.as<double>() == doctest::Approx(def.get<double>()).epsilon(1e-12));
    else if (def.is_string()) CHECK(n.as<std::string>() == def.get<std::string>());
    else if (def.is_array()) CHECK(n.size() == def.size());
  }
}

TEST_CASE("the schema and recipe_to_yaml name exactly the same keys") {
  Recipe r = load_recipe_text(kMinimal + "inference: {}\n", "min.yaml");
  REQUIRE(r.inference.has_value());
  std::set<std::string> emitted;
  leaf_paths(YAML::Load(recipe_to_yaml(r)), "", emitted);
  std::map<std::string, nlohmann::json> leaves;
  schema_leaves(schema(), "", leaves);
  std::set<std::string> in_schema;
  for (const auto& [p, _] : leaves) in_schema.insert(p);
  CHECK(emitted == in_schema);
}

TEST_CASE("fields.h and the schema declare the same keys, types, enum words and defaults") {
  const std::vector<std::string> problems = SchemaCheck::run(schema());
  for (const std::string& p : problems) FAIL_CHECK(p);
  CHECK(problems.empty());

  // The check itself: each way the two can drift apart is caught.
  const auto drifted = [](auto&& edit) {
    nlohmann::json s = schema();
    edit(s["properties"]);
    return SchemaCheck::run(s);
  };
  const auto mentions = [](const std::vector<std::string>& ps, const std::string& what) {
    return std::any_of(ps.begin(), ps.end(), [&](const std::string& p) { return p.find(what) != std::string::npos; });
  };
  CHECK(mentions(drifted([](auto& p) { p["model"]["properties"].erase("norm"); }), "model.norm: declared in fields.h but not"));
  CHECK(mentions(drifted([](auto& p) { p["batch"]["properties"]["warp"] = {{"type", "integer"}}; }),
                 "batch.warp: in the schema but not declared"));
  CHECK(mentions(drifted([](auto& p) { p["batch"]["properties"]["micro"]["type"] = "number"; }), "batch.micro: fields.h says integer"));
  CHECK(mentions(drifted([](auto& p) { p["train"]["properties"]["steps"]["default"] = 99; }), "train.steps: default 100"));
  CHECK(mentions(drifted([](auto& p) { p["optimizer"]["properties"]["lr"]["default"] = 0.001; }), "optimizer.lr: default"));
  CHECK(mentions(drifted([](auto& p) { p["data"]["properties"]["kind"]["enum"].push_back("parquet"); }), "data.kind: enum words"));
  CHECK(mentions(drifted([](auto& p) { p["recompute"]["properties"]["modules"]["items"]["enum"].erase(0); }),
                 "recompute.modules: enum words"));
  CHECK(mentions(drifted([](auto& p) { p["parallel"]["properties"]["schedule"]["default"] = "gpipe"; }), "parallel.schedule: default"));
  CHECK(mentions(drifted([](auto& p) { p["data"]["properties"]["dataset"]["enum"] = nlohmann::json::array({"tokens", "ids"}); }),
                 "data.dataset: the schema lists words"));
  CHECK(mentions(drifted([](auto& p) { p.erase("inference"); }), "inference: declared in fields.h but not"));
}

TEST_CASE("enum words: one table each; parse and to_string are inverse; JSON writes the word") {
  const auto check_table = [](auto e) {
    using E = decltype(e);
    std::set<std::string> words;
    for (const auto& [value, word] : enum_names(E{})) {
      INFO("word: " << std::string(word));
      CHECK(words.insert(std::string(word)).second);
      CHECK(to_string(value) == word);
      REQUIRE(parse_enum<E>(word).has_value());
      CHECK(*parse_enum<E>(word) == value);
      CHECK(nlohmann::json(value) == nlohmann::json(std::string(word)));
    }
    CHECK(!parse_enum<E>("").has_value());
    CHECK(!parse_enum<E>(std::string(*words.begin()) + "x").has_value());
  };
  check_table(ModelFamily{});
  check_table(Norm{});
  check_table(Activation{});
  check_table(Position{});
  check_table(DataKind{});
  check_table(PipelineSchedule{});
  check_table(FloatFormat{});
  check_table(MasterWeights{});
  check_table(LossScaleMode{});
  check_table(RecomputeMode{});
  check_table(RecomputeModule{});
  check_table(OptimizerName{});
  check_table(LrSchedule{});
  check_table(CheckpointCadence{});
  check_table(MomentFormat{});
  check_table(KvFormat{});
  CHECK(to_string(PipelineSchedule::one_f_one_b) == "1f1b");
  CHECK(to_string(LossScaleMode::fixed) == "static");
  CHECK(to_string(CheckpointCadence::automatic) == "auto");
  CHECK(nlohmann::json{{"schedule", PipelineSchedule::interleaved}}.dump() == R"({"schedule":"interleaved"})");
  CHECK(!parse_enum<Norm>("RMSNorm").has_value());  // words are case-sensitive, as in the schema
}

TEST_CASE("round trip: recipe_to_yaml -> load_recipe_text gives identical resolved YAML") {
  const std::string text = kMinimal +
                           "data: {kind: text, path: \"my data/shakespeare 1.txt\", val_fraction: 0.1}\n"
                           "parallel: {pp: 2, stage_layers: [1, 1], tp: 2, zero: 1}\n"
                           "recompute: {mode: selective, modules: [attention_core, mlp], layers: [0]}\n"
                           "precision: {compute: fp16, loss_scale: {mode: static, init: 1024}}\n"
                           "optimizer: {lr: 1.0e-3, eps: 1.0e-12, schedule: {kind: linear, warmup_steps: 7}}\n"
                           "checkpoint: {cadence: minutes, every_minutes: 12.5}\n"
                           "train: {run_dir: \"runs/x: y\", seed: 0}\n"
                           "inference: {batch: 2, kv_dtype: int8}\n";
  const Recipe a = load_recipe_text(text, "a.yaml");
  const std::string ya = recipe_to_yaml(a);
  const Recipe b = load_recipe_text(ya, "b.yaml");
  CHECK(recipe_to_yaml(b) == ya);
  CHECK(b.data.path == "my data/shakespeare 1.txt");
  CHECK(b.train.run_dir == "runs/x: y");
  CHECK(b.optimizer.eps == 1e-12);
  CHECK(b.optimizer.lr == 1e-3);
  CHECK(b.parallel.stage_layers == std::vector<int64_t>{1, 1});
  CHECK(b.recompute.modules == std::vector<RecomputeModule>{RecomputeModule::attention_core, RecomputeModule::mlp});
  CHECK(b.checkpoint.every_minutes == 12.5);
  CHECK(b.inference->kv_dtype == KvFormat::int8);
}

TEST_CASE("--set overrides") {
  SUBCASE("int, float, nested, list, new section") {
    const Recipe r = load_recipe_text(kMinimal, "min.yaml",
                                      {"batch.micro=8", "optimizer.lr=2.5e-4", "precision.loss_scale.init=1024",
                                       "parallel.pp=2", "parallel.stage_layers=[1,1]", "inference.batch=4",
                                       "model.d_model=256", "name=renamed"});
    CHECK(r.batch.micro == 8);
    CHECK(r.optimizer.lr == 2.5e-4);
    CHECK(r.precision.loss_scale.init == 1024.0);
    CHECK(r.parallel.stage_layers == std::vector<int64_t>{1, 1});
    REQUIRE(r.inference.has_value());
    CHECK(r.inference->batch == 4);
    CHECK(r.model.d_model == 256);
    CHECK(r.name == "renamed");
    CHECK(r.loc("batch.micro").file == "--set");
    CHECK(r.loc("model.n_heads").file == "min.yaml");  // untouched keys keep their place
    CHECK(r.source_text.find("# --set batch.micro=8\n") != std::string::npos);
  }
  SUBCASE("one list item") {
    const Recipe r = load_recipe_text(kMinimal + "parallel: {pp: 2, stage_layers: [1, 1]}\n", "min.yaml",
                                      {"model.n_layers=3", "parallel.stage_layers.1=2"});
    CHECK(r.parallel.stage_layers == std::vector<int64_t>{1, 2});
  }
  SUBCASE("a wrong value is reported at --set") {
    const UserError e = expect_user_error([] { load_recipe_text(kMinimal, "min.yaml", {"batch.micro=eight"}); });
    CHECK(e.loc().file == "--set");
    CHECK(std::string(e.what()).find("batch.micro must be an integer, got 'eight'") != std::string::npos);
  }
  SUBCASE("an unknown path is caught by the schema") {
    const UserError e = expect_user_error([] { load_recipe_text(kMinimal, "min.yaml", {"batch.micr=8"}); });
    CHECK(e.loc().file == "--set");
    CHECK(std::string(e.what()).find("unknown key 'micr' in batch; did you mean 'micro'?") != std::string::npos);
  }
  SUBCASE("a cross-field problem from --set") {
    const UserError e = expect_user_error([] { load_recipe_text(kMinimal, "min.yaml", {"model.n_heads=3"}); });
    CHECK(e.loc().file == "--set");
    CHECK(std::string(e.what()).find("not divisible") != std::string::npos);
  }
  SUBCASE("malformed overrides") {
    for (const char* bad : {"batch.micro", "=8", "batch..micro=8", "batch.micro=[1,2", "model.d_model.x=1", "bat ch=1"}) {
      INFO("override: " << bad);
      const UserError e = expect_user_error([&] { load_recipe_text(kMinimal, "min.yaml", {bad}); });
      CHECK(e.loc().file == "--set");
      CHECK(e.loc().line == 0);
      CHECK(std::string(e.what()).rfind("--set: ", 0) == 0);
      CHECK(!e.fix().empty());
      check_clean(e.what());
    }
  }
}

TEST_CASE("Recipe::loc: the key's place, else the nearest written parent, else the file") {
  const std::string text = kMinimal +
                           "precision:\n"
                           "  compute: fp16\n"
                           "  loss_scale:\n"
                           "    init: 1024\n"
                           "recompute:\n"
                           "  mode: full\n"
                           "  layers: [0, 1]\n";
  const Recipe r = load_recipe_text(text, "r.yaml");
  const SourceLoc init = r.loc("precision.loss_scale.init");
  CHECK(init.file == "r.yaml");
  CHECK(init.line == 11);
  CHECK(init.col == 5);
  const SourceLoc growth = r.loc("precision.loss_scale.growth_factor");  // not written: its parent
  CHECK(growth.line == 10);
  CHECK(growth.col == 3);
  const SourceLoc item = r.loc("recompute.layers[1]");
  CHECK(item.line == 14);
  CHECK(item.col == 15);
  const SourceLoc nothing = r.loc("optimizer.lr");
  CHECK(nothing.file == "r.yaml");
  CHECK(nothing.line == 0);
  CHECK(r.loc("model.n_heads").line == 7);
}

TEST_CASE("YAML 1.2 core-schema typing") {
  const Recipe r = load_recipe_text(
      "name: \"123\"\n"
      "model: {vocab_size: 256, seq_len: 64, d_model: 128, n_layers: 2, n_heads: 4, tie_embeddings: True, bias: FALSE}\n"
      "data: {dataset: 'yes'}\n"
      "optimizer: {lr: 1e-3, weight_decay: 0}\n"
      "train: {seed: 0x10, steps: +20, log_every: 010}\n",
      "t.yaml");
  CHECK(r.name == "123");                  // quoted: a string
  CHECK(r.model.tie_embeddings == true);
  CHECK(r.model.bias == false);
  CHECK(r.data.dataset == "yes");          // yes/no are text in YAML 1.2
  CHECK(r.optimizer.lr == 1e-3);           // 1e-3 is a float (YAML 1.1 would say text)
  CHECK(r.optimizer.weight_decay == 0.0);  // an integer is a fine number
  CHECK(r.train.seed == 16);
  CHECK(r.train.steps == 20);
  CHECK(r.train.log_every == 10);
}

TEST_CASE("validate_recipe checks a recipe edited in code") {
  Recipe r = load_recipe_text(kMinimal, "min.yaml");
  CHECK_NOTHROW(validate_recipe(r));
  r.model.n_heads = 3;
  const UserError e = expect_user_error([&] { validate_recipe(r); });
  CHECK(e.loc().file == "min.yaml");
  CHECK(e.loc().line == 7);  // model.n_heads
}

TEST_CASE("file problems name the path") {
  const UserError missing = expect_user_error([] { load_recipe("/no/such/recipe.yaml"); });
  CHECK(missing.loc().file == "/no/such/recipe.yaml");
  CHECK(std::string(missing.what()).find("not found") != std::string::npos);
  const UserError dir = expect_user_error([] { load_recipe(RUNNER_TEST_DIR); });
  CHECK(dir.loc().file == RUNNER_TEST_DIR);
}

TEST_CASE("garbage never crashes and always gets a located message with a fix") {
  std::vector<std::string> inputs = {
      "",
      "---\n",
      ",",
      ",- x: y\nd\n- model: {}\n",
      "~",
      "[",
      "{:",
      "key",
      "name: x\nmodel: *nope\n",
      "name: x\n\0model: {}\n",
      std::string("name: \xff\xfe\n"),
      "name: x\nmodel:\n  vocab_size: 99999999999999999999999\n  seq_len: 1\n  d_model: 1\n  n_layers: 1\n  n_heads: 1\n",
      "name: x\nmodel:\n  vocab_size: .nan\n",
      "name: x\nmodel: {vocab_size: 1, seq_len: 1, d_model: 9223372036854775807, n_layers: 1, n_heads: 9223372036854775806}\n",
      "name: x\nmodel: {vocab_size: 1, seq_len: 1, d_model: 2, n_layers: 1, n_heads: 1}\n"
      "parallel: {pp: 9223372036854775807, stage_layers: [9223372036854775807, 9223372036854775807]}\n",
      "? [a]\n: 1\n",
      "a: 1\n---\nb: 2\n",
  };
  inputs.push_back("a: " + std::string(5000, '[') + std::string(5000, ']') + "\n");
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += std::string(static_cast<size_t>(2 * i), ' ') + "k:\n";
  inputs.push_back(deep);
  std::mt19937 g(7);
  for (int i = 0; i < 50; ++i) {
    std::string bytes(256, '\0');
    for (char& c : bytes) c = static_cast<char>(g() % 256);
    inputs.push_back(bytes);
  }
  const std::string base = read(fs::path(RUNNER_SOURCE_DIR) / "recipes" / "quickstart.yaml");
  const std::string alphabet = ":-[]{}#&*!|>'\",? \t\n0123456789abcxyz.";
  for (int i = 0; i < 300; ++i) {
    std::string s = base;
    for (int k = 0; k < 3; ++k) s[g() % s.size()] = alphabet[g() % alphabet.size()];
    inputs.push_back(s);
  }
  for (const std::string& in : inputs) {
    try {
      const Recipe r = load_recipe_text(in, "g.yaml");
      CHECK(recipe_to_yaml(load_recipe_text(recipe_to_yaml(r), "g2.yaml")) == recipe_to_yaml(r));
    } catch (const UserError& e) {
      INFO("input: " << in.substr(0, 80));
      INFO("message: " << e.what());
      CHECK(e.loc().file == "g.yaml");
      CHECK(std::string(e.what()).find("; ") != std::string::npos);
      check_clean(e.what());
    }
  }
}

TEST_CASE("RUNNER_SCHEMA names the schema; a missing one is a clear error") {
  const UserError e = [] {
    test_support::ScopedEnv schema("RUNNER_SCHEMA", "/no/such/recipe.schema.json");
    return expect_user_error([] { load_recipe_text(kMinimal, "min.yaml"); });
  }();
  CHECK(std::string(e.what()).find("RUNNER_SCHEMA") != std::string::npos);
  CHECK_NOTHROW(load_recipe_text(kMinimal, "min.yaml"));
}

// ---------------------------------------------------------------------------------------
// Every independent mistake in one pass, hints for other tools' key names, no
// default on a required key, no empty example, device suggestions by what the name says.

namespace {

// The problems a recipe text has, each as "line:col: what; fix" (every one in one pass).
std::vector<std::string> problems_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> out;
  try {
    load_recipe_text(text, "r.yaml", sets);
  } catch (const UserError& e) {
    for (const UserError::Entry& p : e.all())
      out.push_back((p.loc.file == "--set" ? std::string("--set") : std::to_string(p.loc.line) + ":" + std::to_string(p.loc.col)) +
                    ": " + p.what + "; " + p.fix);
  }
  return out;
}

bool any_has(const std::vector<std::string>& v, const std::string& what) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(what) != std::string::npos; });
}

}  // namespace

TEST_CASE("every independent mistake is reported in one pass, in file order, each located with its fix") {
  const std::string text =
      "name: draft\n"                        // 1
      "model:\n"                             // 2
      "  vocab_size: 256\n"                  // 3
      "  d_model: 100\n"                     // 4
      "  n_layer: 4\n"                       // 5  nanoGPT's name
      "  dropout: 1.5\n"                     // 6  out of range
      "batch:\n"                             // 7
      "  micro: eight\n"                     // 8  wrong type
      "optimizer:\n"                         // 9
      "  lr: 3.0e-4\n"                       // 10
      "  schedule: {kind: cosin}\n"          // 11 enum typo
      "recompute: {mode: selective}\n"       // 12 cross-field: selective without modules
      "hardware: {device: h100}\n";          // 13 enum: h100-80gb
  const std::vector<std::string> ps = problems_of(text);
  for (const std::string& p : ps) INFO(p);
  REQUIRE(ps.size() == 8);
  CHECK(ps[0].rfind("5:3: unknown key 'n_layer' in model; that is nanoGPT and Hugging Face's name; here it is model.n_layers: write n_layers instead", 0) == 0);
  CHECK(ps[1].rfind("6:12: model.dropout must be in [0, 1), got 1.5", 0) == 0);
  CHECK(ps[2].rfind("8:10: batch.micro must be an integer, got 'eight'", 0) == 0);
  CHECK(ps[3].rfind("11:20: optimizer.schedule.kind must be one of", 0) == 0);
  CHECK(ps[3].find("did you mean 'cosine'?") != std::string::npos);
  CHECK(ps[4].rfind("12:13: recompute mode selective needs recompute.modules", 0) == 0);
  CHECK(ps[5].rfind("13:20: hardware.device must be one of", 0) == 0);
  CHECK(ps[5].find("did you mean 'h100-80gb'?") != std::string::npos);
  // The missing required keys, all of them, after the rest; n_layers is not repeated as
  // missing: the n_layer line already says to write it.
  CHECK(ps[6].rfind("2:1: model is missing required key 'seq_len'; add seq_len: <int>", 0) == 0);
  CHECK(ps[7].rfind("2:1: model is missing required key 'n_heads'", 0) == 0);
  CHECK_FALSE(any_has(ps, "missing required key 'n_layers'"));
  // Dependent: n_heads is missing, so "d_model 100 not divisible by the default 6" is not said.
  CHECK_FALSE(any_has(ps, "not divisible"));

  // The message: one located line per problem, then the count.
  const UserError e = expect_user_error([&] { load_recipe_text(text, "r.yaml"); });
  const std::string msg = e.what();
  CHECK(msg.rfind("r.yaml:5:3: unknown key 'n_layer'", 0) == 0);
  CHECK(msg.find("\nr.yaml:13:20: hardware.device") != std::string::npos);
  CHECK(msg.find("\n8 problems") != std::string::npos);
  CHECK(e.loc().line == 5);  // loc() is the first problem's
  check_clean(msg);

  // One problem still reads as before: one line, no count.
  const UserError one = expect_user_error([] { load_recipe_text(kMinimal + "batch: {micro: -1}\n", "r.yaml"); });
  CHECK(std::string(one.what()).find('\n') == std::string::npos);
  CHECK(one.all().size() == 1);
}

TEST_CASE("a problem keeps the rules that read its field quiet: no cascade") {
  // d_model has the wrong type: no divisibility or rope complaint built on the default.
  auto ps = problems_of("name: x\nmodel: {vocab_size: 256, seq_len: 64, d_model: wide, n_layers: 2, n_heads: 3, position: rope}\n");
  CHECK(ps.size() == 1);
  CHECK(any_has(ps, "model.d_model must be an integer"));
  // Not divisible: the rope rule (head size) follows from it and is not repeated.
  ps = problems_of("name: x\nmodel: {vocab_size: 256, seq_len: 64, d_model: 100, n_layers: 2, n_heads: 3, position: rope}\n");
  CHECK(ps.size() == 1);
  CHECK(any_has(ps, "not divisible"));
  // auto with modules: one problem at modules, not also "modules only applies to selective".
  ps = problems_of(kMinimal + "recompute: {mode: auto, modules: [mlp], layers: [9]}\n");
  CHECK(ps.size() == 2);
  CHECK(any_has(ps, "auto chooses the modules itself"));
  CHECK(any_has(ps, "auto chooses the layers itself"));
  CHECK_FALSE(any_has(ps, "lists layer 9"));
  // stage_layers: a wrong count is one problem (its sum is not judged against it).
  ps = problems_of(kMinimal + "parallel: {pp: 2, stage_layers: [5]}\n");
  CHECK(ps.size() == 1);
  // A wrong cadence interval and a mistyped section name elsewhere: both, independent.
  ps = problems_of(kMinimal + "checkpoint: {cadence: minutes, every_steps: 5}\ntrian: {steps: 3}\n");
  CHECK(ps.size() == 2);
  CHECK(any_has(ps, "cadence minutes needs checkpoint.every_minutes"));
  CHECK_FALSE(any_has(ps, "every_steps has no effect"));
  CHECK(any_has(ps, "did you mean 'train'?"));
  // A misnamed key stands for the missing one: neither "missing n_heads" nor a divisibility
  // complaint built on n_heads' default (128 is not divisible by 6).
  ps = problems_of("name: x\nmodel: {vocab_size: 256, seq_len: 64, d_model: 128, n_layers: 2, n_head: 4}\n");
  REQUIRE(ps.size() == 1);
  CHECK(any_has(ps, "unknown key 'n_head'"));
  ps = problems_of("name: x\nmodel: {vocab_size: 256, seq_len: 64, d_model: 128, n_layers: 2, n_haeds: 4}\n");
  REQUIRE(ps.size() == 1);
  CHECK(any_has(ps, "did you mean 'n_heads'?"));
  // --set problems come with the file's, after them.
  ps = problems_of(kMinimal + "batch: {micro: x}\n", {"optimizer.lr=-1", "model.n_heads=3"});
  REQUIRE(ps.size() == 3);
  CHECK(ps[0].rfind("8:16: batch.micro", 0) == 0);
  CHECK(any_has(ps, "--set: optimizer.lr must be > 0"));
  CHECK(any_has(ps, "--set: model.d_model 128 is not divisible by model.n_heads 3"));
  // An unknown key beside a structural problem (a duplicate key): both.
  ps = problems_of(kMinimal + "batch: {micro: 2, micro: 4}\nfoo: 1\n");
  CHECK(ps.size() == 2);
  CHECK(any_has(ps, "duplicate key 'micro'"));
  CHECK(any_has(ps, "unknown key 'foo'"));
}

TEST_CASE("other tools' key names point at ours (nanoGPT, Megatron-LM, torchtitan, Hugging Face)") {
  struct Case { const char* where; const char* key; const char* ours; };
  const Case cases[] = {
      {"model", "block_size", "model.seq_len"},       {"model", "n_embd", "model.d_model"},
      {"model", "n_layer", "model.n_layers"},         {"model", "n_head", "model.n_heads"},
      {"model", "num_key_value_heads", "model.n_kv_heads"}, {"model", "num_query_groups", "model.n_kv_heads"},
      {"", "learning_rate", "optimizer.lr"},          {"", "batch_size", "batch.micro"},
      {"", "max_iters", "train.steps"},               {"", "warmup_iters", "optimizer.schedule.warmup_steps"},
      {"optimizer", "warmup", "optimizer.schedule.warmup_steps"},
      {"model", "num_layers", "model.n_layers"},      {"model", "hidden_size", "model.d_model"},
      {"model", "num_attention_heads", "model.n_heads"}, {"model", "seq_length", "model.seq_len"},
      {"batch", "micro_batch_size", "batch.micro"},   {"batch", "global_batch_size", "batch.global"},
      {"parallel", "tensor_model_parallel_size", "parallel.tp"},
      {"parallel", "pipeline_model_parallel_size", "parallel.pp"},
      {"train", "train_iters", "train.steps"},        {"model", "dim", "model.d_model"},
      {"model", "max_position_embeddings", "model.seq_len"}, {"model", "num_hidden_layers", "model.n_layers"},
      {"model", "intermediate_size", "model.mlp_ratio"}, {"model", "rms_norm_eps", "model.norm_eps"},
      {"", "gradient_accumulation_steps", "batch.accum"},
  };
  for (const Case& c : cases) {
    INFO(c.where << "." << c.key);
    const std::string text = std::string(c.where).empty() ? kMinimal + c.key + ": 8\n"
                             : std::string(c.where) == "model" ? kMinimal + "  " + c.key + ": 8\n"
                                                               : kMinimal + c.where + ":\n  " + c.key + ": 8\n";
    const auto ps = problems_of(text);
    REQUIRE(ps.size() == 1);
    CHECK(ps[0].find("unknown key '" + std::string(c.key) + "'") != std::string::npos);
    CHECK(ps[0].find("here it is " + std::string(c.ours)) != std::string::npos);
    // Written in the section it belongs to: "write LEAF instead"; elsewhere: under its section.
    const std::string ours = c.ours, parent = ours.substr(0, ours.rfind('.')), leaf = ours.substr(ours.rfind('.') + 1);
    CHECK(ps[0].find(parent == c.where ? "write " + leaf + " instead" : "write " + leaf + " under " + parent + ":") !=
          std::string::npos);
  }
  // --set gets the same hint.
  const auto ps = problems_of(kMinimal, {"model.block_size=64"});
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].find("--set: unknown key 'block_size' in model; that is nanoGPT's name; here it is model.seq_len") == 0);
}

TEST_CASE("the schema gives no default for a required key (an editor would suggest a refused value)") {
  int required = 0;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& sub, const std::string& path) {
    if (!sub.is_object() || !sub.contains("properties")) return;
    for (const auto& k : sub.value("required", nlohmann::json::array())) {
      const std::string key = k.get<std::string>();
      INFO("required key " << path << key);
      REQUIRE(sub["properties"].contains(key));
      CHECK_FALSE(sub["properties"][key].contains("default"));
      if (sub["properties"][key].value("type", "") != "object")
        CHECK(sub["properties"][key].contains("examples"));  // what an editor offers instead
      ++required;
    }
    for (auto it = sub["properties"].begin(); it != sub["properties"].end(); ++it) walk(it.value(), path + it.key() + ".");
  };
  walk(schema(), "");
  CHECK(required >= 7);  // name, model, and model's five shape keys
  // And a missing one says so, with an example instead of a default.
  const auto ps = problems_of("name: x\nmodel:\n  seq_len: 64\n  d_model: 128\n  n_layers: 2\n  n_heads: 4\n  vocab_size:\n");
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].find("like 256); it is required and has no default") != std::string::npos);
}

TEST_CASE("no message shows an empty example, whatever key is left empty or given the wrong shape") {
  std::map<std::string, nlohmann::json> leaves;
  schema_leaves(schema(), "", leaves);
  const std::regex empty_example(R"(like\s*[),;]|like\s*$|e\.g\. [a-z_]+:\s*($|[;),])|like ''|like ""|\(like \))");
  int checked = 0;
  for (const auto& [path, sub] : leaves) {
    for (const char* value : {"null", "{a: 1}", "[1, 2]", "0.5", "text"}) {
      const std::vector<std::string> ps = problems_of(kMinimal + "inference: {}\n", {path + "=" + value});
      for (const std::string& p : ps) {
        INFO(path << "=" << value << ": " << p);
        CHECK_FALSE(std::regex_search(p, empty_example));
        ++checked;
      }
    }
  }
  CHECK(checked > 200);
}

TEST_CASE("device names: a suggestion by what the name says, not by spelling alone") {
  const auto fix_for = [](const std::string& device) {
    const auto ps = problems_of(kMinimal, {"hardware.device=" + device});
    REQUIRE(ps.size() == 1);
    return ps[0];
  };
  CHECK(fix_for("h100").find("did you mean 'h100-80gb'?") != std::string::npos);  // not h200, one letter away
  CHECK(fix_for("H100-SXM").find("did you mean 'h100-80gb'?") != std::string::npos);
  CHECK(fix_for("a100").find("did you mean 'a100-40gb' or 'a100-80gb'?") != std::string::npos);
  CHECK(fix_for("nvidia-v100").find("did you mean 'v100-32gb'?") != std::string::npos);
  CHECK(fix_for("H200").find("did you mean 'h200'?") != std::string::npos);
  CHECK(fix_for("gpu").find("did you mean 'cuda'?") != std::string::npos);   // not cpu
  CHECK(fix_for("l40").find("did you mean 'l40s'?") != std::string::npos);
  CHECK(fix_for("tpu-v5").find("pick one of those") != std::string::npos);
}

TEST_CASE("a recipe with very many problems prints a screenful, then how many more") {
  std::string text = kMinimal;
  for (int i = 0; i < 50; ++i) text += "junk_key_" + std::to_string(i) + ": 1\n";
  const UserError e = expect_user_error([&] { load_recipe_text(text, "r.yaml"); });
  CHECK(e.all().size() == 50);
  const std::string msg = e.what();
  CHECK(msg.find("unknown key 'junk_key_39'") != std::string::npos);
  CHECK(msg.find("unknown key 'junk_key_40'") == std::string::npos);
  CHECK(msg.find("\n... and 10 more\n50 problems") != std::string::npos);
}

TEST_CASE("parallel.zero takes 0..3; reshard_after_forward false only with zero 3; DeepSpeed and FSDP names point at zero") {
  for (int zero : {0, 1, 2, 3}) {
    INFO("zero " << zero);
    CHECK(problems_of(kMinimal + "parallel:\n  zero: " + std::to_string(zero) + "\n").empty());
    CHECK(load_recipe_text(kMinimal + "parallel: {zero: " + std::to_string(zero) + "}\n", "r.yaml").parallel.zero == zero);
  }
  auto ps = problems_of(kMinimal + "parallel:\n  zero: 4\n");
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].rfind("9:9: parallel.zero must be one of 0, 1, 2, 3, got 4", 0) == 0);
  // Default true; false is read and kept with zero 3.
  CHECK(load_recipe_text(kMinimal, "r.yaml").parallel.reshard_after_forward);
  const Recipe keep = load_recipe_text(kMinimal + "parallel: {zero: 3, reshard_after_forward: false}\n", "r.yaml");
  CHECK_FALSE(keep.parallel.reshard_after_forward);
  ps = problems_of(kMinimal + "parallel:\n  zero: 1\n  reshard_after_forward: false\n");
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].rfind("10:3: parallel.reshard_after_forward: false only applies to zero 3 (parallel.zero is 1)", 0) == 0);
  CHECK(ps[0].find("set zero: 3, or remove reshard_after_forward") != std::string::npos);
  ps = problems_of(kMinimal, {"parallel.reshard_after_forward=false"});
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].rfind("--set: parallel.reshard_after_forward: false only applies to zero 3", 0) == 0);
  struct Case { const char* key; const char* tool; const char* note; };
  const Case cases[] = {{"stage", "DeepSpeed", "stage 3 is zero: 3"},
                        {"zero_optimization", "DeepSpeed", "its stage is our zero"},
                        {"sharding_strategy", "PyTorch FSDP", "FULL_SHARD is zero: 3"},
                        {"fsdp", "Hugging Face TrainingArguments", "full_shard is zero: 3"}};
  for (const Case& c : cases) {
    INFO(c.key);
    ps = problems_of(kMinimal + "parallel:\n  " + c.key + ": 3\n");
    REQUIRE(ps.size() == 1);
    CHECK(ps[0].find("unknown key '" + std::string(c.key) + "' in parallel; that is " + c.tool +
                     "'s name; here it is parallel.zero: write zero instead") != std::string::npos);
    CHECK(ps[0].find(c.note) != std::string::npos);
  }
  ps = problems_of(kMinimal + "parallel:\n  fsdp_reshard_after_forward: never\n");
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].find("here it is parallel.reshard_after_forward") != std::string::npos);
}
