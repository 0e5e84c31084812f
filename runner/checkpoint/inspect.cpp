// `runner inspect FILE`: what a checkpoint holds (scalars, recipe summary, per-rank RNG and data
// entries, every dataset with shape, dtype, bytes and checksum status) and a verdict line. It
// reports every problem it finds instead of stopping at the first, as verification does. Run in
// a child process by `runner inspect` (isolated.h), so a file that crashes HDF5 is a finding too.
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/checkpoint/file_reader.h"
#include "runner/errors.h"

namespace runner {

using namespace ckpt;

namespace {

std::string summarize_recipe(const std::string& yaml) {
  if (yaml.empty()) return "(none stored)";
  try {
    YAML::Node r = YAML::Load(yaml);
    std::string s = r["name"] ? r["name"].as<std::string>() : "(unnamed)";
    if (auto m = r["model"]) {
      s += " | model";
      for (const char* k : {"family", "d_model", "n_layers", "n_heads", "vocab_size", "seq_len"})
        if (m[k]) s += fmt::format(" {}={}", k, m[k].as<std::string>());
    }
    if (auto t = r["train"]; t && t["steps"]) s += " | train.steps=" + t["steps"].as<std::string>();
    if (auto b = r["batch"]; b && b["global"]) s += " | batch.global=" + b["global"].as<std::string>();
    return s;
  } catch (const std::exception&) {
    std::string first = yaml.substr(0, yaml.find('\n'));
    return "(not parseable as YAML) " + first.substr(0, 80);
  }
}

// The stored recipe's precision.compute when it is not fp16 ("" for fp16 or an unreadable
// recipe): such a run has no loss scale, so the state's scale (1) says nothing.
std::string unscaled_compute(const FileReader& rd) {
  try {
    YAML::Node c = YAML::Load(rd.text(kRecipePath))["precision"]["compute"];
    const std::string compute = c && c.IsScalar() ? c.as<std::string>() : "fp32";
    return compute == "fp16" ? "" : compute;
  } catch (const std::exception&) {
    return "";
  }
}

// The header lines: /state's scalars (false when /state does not verify) and the recipe.
bool describe_state(const FileReader& rd, std::string& out) {
  bool ok = true;
  try {
    StateScalars sc = rd.state();
    out += fmt::format("  format {}, written by runner {}\n", sc.format_version, sc.program_version);
    const std::string unscaled = unscaled_compute(rd);
    const std::string scale = unscaled.empty() ? fmt::format("loss scale {:g} (good steps {}, skipped {})", sc.scale,
                                                             sc.good_steps, sc.skipped_steps)
                                               : "no loss scaling (precision.compute " + unscaled + ")";
    out += fmt::format("  step {}, tokens {}, loss_ema {:.6g}, {}, world size {}\n", sc.step, sc.tokens, sc.loss_ema, scale,
                       sc.world_size);
    out += sc.omp_threads > 0 ? fmt::format("  written with {} OpenMP thread(s) per rank\n", sc.omp_threads)
                              : std::string("  OpenMP threads not recorded (a file from before runner recorded them)\n");
  } catch (const UserError& e) {
    ok = false;
    out += "  /state: BAD: " + e.problem() + "\n";
  }
  try {
    out += "  recipe: " + summarize_recipe(rd.text(kRecipePath)) + "\n";
  } catch (const UserError& e) {
    out += "  recipe: BAD: " + e.problem() + "\n";
  }
  return ok;
}

// One line per /rng and /data entry, by name.
void describe_rank_entries(const FileReader& rd, std::string& out) {
  for (const std::string grp : {kRngGroup, kDataGroup}) {
    const bool is_rng = grp == kRngGroup;
    for (auto& m : rd.members(grp)) {
      try {
        auto v = rd.u64_array(grp + "/" + m, is_rng ? kRngWords : kDataWords);
        if (is_rng)
          out += fmt::format("  rng {}: init_seed {} dropout_seed {} data_seed {} sample_seed {} sample_counter {}\n", m, v[0],
                             v[1], v[2], v[3], v[4]);
        else
          out += fmt::format("  data {}: sample_cursor {} seed {}\n", m, v[0], v[1]);
      } catch (const UserError& e) {
        out += fmt::format("  {}/{}: BAD: {}\n", grp, m, e.problem());
      }
    }
  }
}

}  // namespace

std::string inspect_checkpoint(const std::string& path, bool* ok_out) {
  FileReader rd(path);
  std::string out = fmt::format("checkpoint {} ({} bytes)\n", path, rd.file_size());
  bool ok = describe_state(rd, out);
  // Which datasets there are: /names (format 2), or the groups iterated (format 1). When
  // /names is damaged nothing else can be listed: that is the one problem reported.
  std::string listing_problem;
  bool by_names = false;
  try {
    by_names = rd.listed_by_names();
  } catch (const UserError& e) {
    listing_problem = e.problem();
  }
  std::vector<ScanEntry> entries;
  std::vector<std::string> structure;
  if (listing_problem.empty()) {
    describe_rank_entries(rd, out);
    entries = scan(rd);
    structure = structure_problems(rd);
  }
  size_t width = 8;
  for (auto& e : entries) width = std::max(width, e.d.path.size());
  out += by_names ? "  datasets (as /names lists them):\n"
                  : listing_problem.empty() ? "  datasets (format 1, no /names: found by iterating the groups):\n"
                                            : "  datasets:\n";
  int bad_count = 0;
  uint64_t total = 0;
  for (auto& e : entries) {
    total += e.problem.empty() ? e.d.expected_bytes() : 0;
    std::string status = e.problem.empty() ? fmt::format("crc32c {:#010x} ok", *e.computed) : "BAD: " + e.problem;
    if (!e.problem.empty()) ++bad_count;
    out += fmt::format("    {:<{}}  {:<16} {:<8} {:>12}  {}\n", e.d.path, width, ops::shape_to_string(e.d.shape), e.d.dtype,
                       e.d.expected_bytes(), status);
  }
  if (!listing_problem.empty()) {
    out += "  BAD: " + listing_problem + "\n";
    ++bad_count;
  }
  for (auto& p : structure) {
    out += "  BAD: " + p + "\n";
    ++bad_count;
  }
  if (bad_count) ok = false;
  if (ok)
    out += fmt::format("  verdict: OK ({} datasets, {} bytes, every checksum matches)\n", entries.size(), total);
  else
    out += fmt::format("  verdict: BAD ({} problem{} in {} datasets{})\n", bad_count, bad_count == 1 ? "" : "s",
                       entries.size(), bad_count == 0 ? "; /state fails" : "");
  if (ok_out) *ok_out = ok;
  return out;
}

}  // namespace runner
