// The recipe's closed sets of words, as C++ types.
//
// Each enum has exactly one table, enum_names(E), pairing every value with the word a
// recipe writes (schemas/recipe.schema.json lists the same words; tests/test_recipe.cpp
// checks that they agree). to_string() and parse_enum() read that table, so a word is
// spelled once. Enumerators follow the words, except where the word is a C++ keyword or
// starts with a digit (LossScaleMode::fixed is "static", CheckpointCadence::automatic is
// "auto", PipelineSchedule::one_f_one_b is "1f1b").
//
// A recipe enum written into JSON (nlohmann) becomes its word, never its number.
//
// RecomputeModule is ops::Module, the type graph nodes carry (ops/module.h): a recipe selects
// graph modules, so it holds them directly, with no second enum to map. Its table lists the
// modules a recipe may select, in the schema's order, by the names ops spells.
#pragma once
#include <array>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ops/module.h"

namespace runner {

enum class ModelFamily { gpt };
enum class Norm { layernorm, rmsnorm };
enum class Activation { gelu, swiglu, relu2 };  // kActivationFacts below
enum class Position { learned, rope };
enum class DataKind { addition, text, hdf5, bin };
enum class PipelineSchedule { one_f_one_b, gpipe, interleaved };
enum class FloatFormat { fp32, bf16, fp16 };     // precision.compute, precision.grad_accum
enum class MasterWeights { fp32, same };
enum class LogitsGrad { fp32, compute };  // precision.logits_grad
enum class LossScaleMode { dynamic, fixed, none };
enum class RecomputeMode { none, full, selective, automatic };  // automatic is "auto"
using RecomputeModule = ops::Module;     // attention_core, attention, mlp, norm (its table)
enum class OptimizerName { adamw };
enum class LrSchedule { cosine, linear, constant };
enum class CheckpointCadence { steps, minutes, automatic, never };
enum class MomentFormat { fp32, bf16 };          // checkpoint.optimizer_dtype
enum class KvFormat { fp32, fp16, bf16, int8 };  // inference.kv_dtype

template <class E, size_t N>
using EnumTable = std::array<std::pair<E, std::string_view>, N>;

// clang-format off
constexpr EnumTable<ModelFamily, 1> enum_names(ModelFamily) { return {{{ModelFamily::gpt, "gpt"}}}; }
constexpr EnumTable<Norm, 2> enum_names(Norm) {
  return {{{Norm::layernorm, "layernorm"}, {Norm::rmsnorm, "rmsnorm"}}};
}
// An activation is its row here: its word; whether the MLP is gated (swiglu: three weight
// matrices, Llama's); the name Hugging Face's GPT-2 config gives an ungated one
// (activation_function, a key of transformers' ACT2FN), which export writes, and the other
// names of the same function, which import also accepts. Its graph operator is the OpDef of
// the same name (ops/op_pointwise.cpp: model/gpt.cpp looks it up by the word).
struct ActivationFacts {
  Activation value;
  std::string_view word;
  bool gated;
  std::string_view hf;
  std::array<std::string_view, 2> hf_same;
};
constexpr std::array<ActivationFacts, 3> kActivationFacts = {{
    {Activation::gelu, "gelu", false, "gelu_new", {"gelu_pytorch_tanh", "gelu_fast"}},  // GPT-2's tanh GELU
    {Activation::swiglu, "swiglu", true, "silu", {}},
    {Activation::relu2, "relu2", false, "relu2", {}},  // relu(x)^2 (Primer, Nemotron-4)
}};
constexpr const ActivationFacts& activation_facts(Activation a) {
  for (const ActivationFacts& f : kActivationFacts)
    if (f.value == a) return f;
  std::abort();  // a value outside its own table
}
constexpr EnumTable<Activation, kActivationFacts.size()> enum_names(Activation) {
  EnumTable<Activation, kActivationFacts.size()> t{};
  for (size_t i = 0; i < t.size(); ++i) t[i] = {kActivationFacts[i].value, kActivationFacts[i].word};
  return t;
}
constexpr EnumTable<Position, 2> enum_names(Position) {
  return {{{Position::learned, "learned"}, {Position::rope, "rope"}}};
}
constexpr EnumTable<DataKind, 4> enum_names(DataKind) {
  return {{{DataKind::addition, "addition"}, {DataKind::text, "text"}, {DataKind::hdf5, "hdf5"}, {DataKind::bin, "bin"}}};
}
constexpr EnumTable<PipelineSchedule, 3> enum_names(PipelineSchedule) {
  return {{{PipelineSchedule::one_f_one_b, "1f1b"}, {PipelineSchedule::gpipe, "gpipe"},
           {PipelineSchedule::interleaved, "interleaved"}}};
}
constexpr EnumTable<FloatFormat, 3> enum_names(FloatFormat) {
  return {{{FloatFormat::fp32, "fp32"}, {FloatFormat::bf16, "bf16"}, {FloatFormat::fp16, "fp16"}}};
}
constexpr EnumTable<MasterWeights, 2> enum_names(MasterWeights) {
  return {{{MasterWeights::fp32, "fp32"}, {MasterWeights::same, "same"}}};
}
constexpr EnumTable<LogitsGrad, 2> enum_names(LogitsGrad) {
  return {{{LogitsGrad::fp32, "fp32"}, {LogitsGrad::compute, "compute"}}};
}
constexpr EnumTable<LossScaleMode, 3> enum_names(LossScaleMode) {
  return {{{LossScaleMode::dynamic, "dynamic"}, {LossScaleMode::fixed, "static"}, {LossScaleMode::none, "none"}}};
}
constexpr EnumTable<RecomputeMode, 4> enum_names(RecomputeMode) {
  return {{{RecomputeMode::none, "none"}, {RecomputeMode::full, "full"}, {RecomputeMode::selective, "selective"},
           {RecomputeMode::automatic, "auto"}}};
}
constexpr EnumTable<RecomputeModule, 4> enum_names(RecomputeModule) {
  using M = ops::Module;
  return {{{M::attention_core, ops::module_name(M::attention_core)}, {M::attention, ops::module_name(M::attention)},
           {M::mlp, ops::module_name(M::mlp)}, {M::norm, ops::module_name(M::norm)}}};
}
constexpr EnumTable<OptimizerName, 1> enum_names(OptimizerName) { return {{{OptimizerName::adamw, "adamw"}}}; }
constexpr EnumTable<LrSchedule, 3> enum_names(LrSchedule) {
  return {{{LrSchedule::cosine, "cosine"}, {LrSchedule::linear, "linear"}, {LrSchedule::constant, "constant"}}};
}
constexpr EnumTable<CheckpointCadence, 4> enum_names(CheckpointCadence) {
  return {{{CheckpointCadence::steps, "steps"}, {CheckpointCadence::minutes, "minutes"},
           {CheckpointCadence::automatic, "auto"}, {CheckpointCadence::never, "never"}}};
}
constexpr EnumTable<MomentFormat, 2> enum_names(MomentFormat) {
  return {{{MomentFormat::fp32, "fp32"}, {MomentFormat::bf16, "bf16"}}};
}
constexpr EnumTable<KvFormat, 4> enum_names(KvFormat) {
  return {{{KvFormat::fp32, "fp32"}, {KvFormat::fp16, "fp16"}, {KvFormat::bf16, "bf16"}, {KvFormat::int8, "int8"}}};
}
// clang-format on

template <class E>
concept RecipeEnum = std::is_enum_v<E> && requires { enum_names(E{}); };

// The word for `e`, as a recipe writes it.
template <RecipeEnum E>
constexpr std::string_view enum_word(E e) {
  for (const auto& [value, word] : enum_names(E{}))
    if (value == e) return word;
  std::abort();  // a value outside its own table: memory corruption or a cast from garbage
}
template <RecipeEnum E>
std::string to_string(E e) { return std::string(enum_word(e)); }
// Every module has a name, selectable by a recipe or not (a node's module: residual, embed).
inline std::string to_string(ops::Module m) { return std::string(ops::module_name(m)); }

// The value a recipe word names; nullopt for a word outside the table.
template <RecipeEnum E>
constexpr std::optional<E> parse_enum(std::string_view word) {
  for (const auto& [value, w] : enum_names(E{}))
    if (w == word) return value;
  return std::nullopt;
}

// nlohmann::json finds these by argument-dependent lookup: an enum assigned to a json
// value is written as its word (nlohmann's default would be the enumerator's number).
// One non-template-enum overload per enum, so overload resolution prefers it to
// nlohmann's catch-all for enums. RecomputeModule's is ops::to_json (ops/module.h), found in
// its own namespace.
#define RUNNER_RECIPE_ENUM_JSON(E) \
  template <class Json>            \
  void to_json(Json& j, const E& e) { j = to_string(e); }
RUNNER_RECIPE_ENUM_JSON(ModelFamily)
RUNNER_RECIPE_ENUM_JSON(Norm)
RUNNER_RECIPE_ENUM_JSON(Activation)
RUNNER_RECIPE_ENUM_JSON(Position)
RUNNER_RECIPE_ENUM_JSON(DataKind)
RUNNER_RECIPE_ENUM_JSON(PipelineSchedule)
RUNNER_RECIPE_ENUM_JSON(FloatFormat)
RUNNER_RECIPE_ENUM_JSON(MasterWeights)
RUNNER_RECIPE_ENUM_JSON(LogitsGrad)
RUNNER_RECIPE_ENUM_JSON(LossScaleMode)
RUNNER_RECIPE_ENUM_JSON(RecomputeMode)
RUNNER_RECIPE_ENUM_JSON(OptimizerName)
RUNNER_RECIPE_ENUM_JSON(LrSchedule)
RUNNER_RECIPE_ENUM_JSON(CheckpointCadence)
RUNNER_RECIPE_ENUM_JSON(MomentFormat)
RUNNER_RECIPE_ENUM_JSON(KvFormat)
#undef RUNNER_RECIPE_ENUM_JSON

}  // namespace runner
