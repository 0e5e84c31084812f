// The module a graph node belongs to (Node::module), its name, and which modules recomputing
// one of them recomputes.
//
// One type from the recipe to the graph node: a recipe's recompute.modules are these values
// (runner::RecomputeModule is ops::Module; its recipe table lists the ones a recipe may
// select), the builder tags every node with one, recompute sets are ModuleSets, and the
// planner's steps are ModuleSets built with the same rule. The rule "a module brings the
// modules it contains" is written once, as data: the `contains` column of kModuleTable,
// applied by with_parts(). Names are spelled once, here; the plan, the tests and the recipe read them.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ops {

// In the order a layer's nodes run (embed before the layers, head and loss after).
// `none`: a node outside any model module (graphs a test builds by hand).
enum class Module : uint8_t { none, embed, norm, attention, attention_core, mlp, residual, head, loss, Count };
constexpr int kModules = static_cast<int>(Module::Count);

struct ModuleInfo {
  Module module;
  std::string_view name;
  Module contains;  // recomputing this module recomputes that one too (none: nothing more)
  bool in_layer;    // a transformer layer's module: recomputing a whole layer recomputes it
};

// attention contains attention_core (softmax(QK^T)V), which runs between the block's
// projections: a recompute segment frees none of its outputs that a node outside it reads
// (docs/ledger.md), so recomputing the projections around a kept core would hold q, k, v anyway.
constexpr ModuleInfo kModuleTable[kModules] = {
    {Module::none, "none", Module::none, false},
    {Module::embed, "embed", Module::none, false},
    {Module::norm, "norm", Module::none, true},
    {Module::attention, "attention", Module::attention_core, true},
    {Module::attention_core, "attention_core", Module::none, true},
    {Module::mlp, "mlp", Module::none, true},
    {Module::residual, "residual", Module::none, true},
    {Module::head, "head", Module::none, false},
    {Module::loss, "loss", Module::none, false},
};

constexpr const ModuleInfo& module_info(Module m) { return kModuleTable[static_cast<int>(m)]; }
// The name every printer uses (plan text and JSON, traces, tests).
constexpr std::string_view module_name(Module m) { return module_info(m).name; }

// A set of modules: one layer's recompute set, or what one recompute step adds.
class ModuleSet {
 public:
  constexpr ModuleSet() = default;
  constexpr ModuleSet(std::initializer_list<Module> ms) {
    for (Module m : ms) bits_ |= bit(m);
  }
  constexpr bool has(Module m) const { return (bits_ & bit(m)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr ModuleSet operator|(ModuleSet o) const { return from_bits(bits_ | o.bits_); }
  constexpr ModuleSet& operator|=(ModuleSet o) { bits_ |= o.bits_; return *this; }
  constexpr bool operator==(const ModuleSet&) const = default;
  constexpr bool operator<(const ModuleSet& o) const { return bits_ < o.bits_; }  // map keys only

 private:
  static constexpr uint32_t bit(Module m) { return 1u << static_cast<int>(m); }
  static constexpr ModuleSet from_bits(uint32_t b) { ModuleSet s; s.bits_ = b; return s; }
  uint32_t bits_ = 0;
};

// What recomputing `selected` recomputes: each module with the modules it contains. Every
// recompute set a graph is built from has been through this (the recipe's selective and full
// modes, the planner's steps), so a node is recomputed iff its layer's set has its module.
constexpr ModuleSet with_parts(ModuleSet selected) {
  ModuleSet s = selected;
  for (const ModuleInfo& i : kModuleTable)
    if (selected.has(i.module) && i.contains != Module::none) s |= ModuleSet{i.contains};
  return s;
}

// Every module of a transformer layer: what recompute mode full and the planner's "layer"
// step recompute (the residual adds included).
constexpr ModuleSet layer_modules() {
  ModuleSet s;
  for (const ModuleInfo& i : kModuleTable)
    if (i.in_layer) s |= ModuleSet{i.module};
  return s;
}

// The names of the modules in `s`, in name order (how plan.json has always listed a set).
inline std::vector<std::string> module_names(ModuleSet s) {
  std::vector<std::string> names;
  for (const ModuleInfo& i : kModuleTable)
    if (s.has(i.module)) names.emplace_back(i.name);
  std::sort(names.begin(), names.end());
  return names;
}

// Written to JSON (nlohmann, by argument-dependent lookup), a Module is its name and a
// ModuleSet the array of its names, in name order.
template <class Json>
void to_json(Json& j, const Module& m) {
  j = std::string(module_name(m));
}
template <class Json>
void to_json(Json& j, const ModuleSet& s) {
  j = module_names(s);
}

}  // namespace ops
