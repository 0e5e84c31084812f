// Loading and verifying checkpoints: every dataset the state needs is checked (presence, type,
// shape, storage) before any byte is read, then read in bounded pieces and checksummed
// (docs/checkpoint-format.md, "What loading checks").
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/checkpoint/file_reader.h"
#include "runner/checkpoint/staging.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"

namespace runner {

using namespace ckpt;

namespace {

// One tensor dataset to be read into the state.
struct Planned {
  DsInfo d;
  size_t index;       // parameter index
  int which;          // TensorRole
  ops::DType stored;
};

// Checks every tensor dataset the state needs, and that the file holds no tensor the model
// lacks (unless `subset`), before anything is read.
std::vector<Planned> plan_tensors(const FileReader& rd, const TrainState& s, bool subset) {
  const ParamSet& ps = s.params;
  std::vector<Planned> plan;
  std::set<std::string> expected_names(ps.names.begin(), ps.names.end());
  for (size_t i = 0; i < ps.names.size(); ++i) {
    DsInfo d = rd.info(tensor_path(kParam, ps.names[i]));
    rd.expect(d, ps.values[i].shape(), ps.values[i].dtype(), "parameter");
    plan.push_back({d, i, kParam, ps.values[i].dtype()});
  }
  for (auto& n : rd.members(tensor_group(kParam)))
    if (!subset && !expected_names.count(n))
      bad(rd.path(), "dataset " + tensor_path(kParam, n) + " is a parameter the model does not have",
          "the recipe's model differs from the one that wrote this checkpoint; resume with the stored recipe");
  for (int which : {kAdamM, kAdamV}) {
    for (size_t i = 0; i < ps.names.size(); ++i) {
      DsInfo d = rd.info(tensor_path(which, ps.names[i]));
      ops::DType stored = d.dtype == "bf16" ? ops::DType::BF16 : ops::DType::F32;
      rd.expect(d, ps.values[i].shape(), stored, "Adam moment, fp32 or bf16");
      plan.push_back({d, i, which, stored});
    }
    for (auto& n : rd.members(tensor_group(which)))
      if (!subset && !expected_names.count(n))
        bad(rd.path(), "dataset " + tensor_path(which, n) + " is a moment of a parameter the model does not have");
  }
  return plan;
}

// Reads one planned dataset into `dst`, converting bf16 moments to fp32. A host tensor is read
// into in place; a device tensor through a host staging buffer, then copy_in (the crossing in).
void read_tensor(const FileReader& rd, const Planned& pl, ops::Tensor& dst, std::vector<char>& staging) {
  RUNNER_CHECK(dst.shape() == pl.d.shape, "state tensor for " + pl.d.path + " has shape " + dst.shape_str());
  if (pl.which != kParam) RUNNER_CHECK(dst.dtype() == ops::DType::F32, "Adam moments must be fp32");
  char* host = nullptr;
  if (dst.on_host()) {
    host = static_cast<char*>(dst.host_raw());
  } else {
    staging.resize(dst.nbytes());
    host = staging.data();
  }
  if (pl.stored == dst.dtype()) {
    rd.read(pl.d, host, [](const char*, uint64_t, size_t) {});
  } else {
    float* out = reinterpret_cast<float*>(host);  // bf16 on disk -> fp32 in memory
    rd.read(pl.d, nullptr, [out](const char* p, uint64_t off, size_t n) {
      for (size_t i = 0; i < n / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[off / 2 + i] = bf16_to_f32(h);
      }
    });
  }
  if (!dst.on_host()) copy_in_range(dst, 0, host, dst.nbytes());
}

}  // namespace

void load_checkpoint_file(const std::string& path, TrainState& s, bool subset) {
  h5::Lock lock;  // the whole load: loader workers wait (this happens at start or on resume)
  FileReader rd(path);
  const StateScalars sc = rd.state();
  const ParamSet& ps = s.params;
  RUNNER_CHECK(ps.names.size() == ps.values.size(), "ParamSet names and values differ in length");
  // Every RNG in the runner is counter-based and layout-independent, and the data cursor counts
  // global samples, so a rank of another layout continues from rank 0's entries.
  const int src_rank = rd.exists(rng_path(s.world_rank)) ? s.world_rank : 0;

  // 1. Structure of everything, before any data is read.
  const std::vector<Planned> plan = plan_tensors(rd, s, subset);
  const std::string rng_ds = rng_path(src_rank);
  const std::string data_ds = data_path(src_rank);
  for (const std::string& p : {rng_ds, data_ds, std::string(kRecipePath)}) rd.check_storage(rd.info(p));

  // 2. Small datasets (checksummed) into locals.
  const std::vector<uint64_t> rng = rd.u64_array(rng_ds, kRngWords);
  const std::vector<uint64_t> cursor = rd.u64_array(data_ds, kDataWords);
  if (cursor[0] > static_cast<uint64_t>(INT64_MAX)) bad(path, "dataset " + data_ds + " holds a negative sample cursor", kCorruptFix);
  std::string recipe = rd.text(kRecipePath);

  // 3. Tensors, each checksummed as read.
  if (s.adam_m.empty()) {
    s.adam_v.clear();
    for (auto& p : ps.values) {
      s.adam_m.emplace_back(p.shape(), ops::DType::F32, ops::Account::Optimizer, true, p.device());  // beside the values
      s.adam_v.emplace_back(p.shape(), ops::DType::F32, ops::Account::Optimizer, true, p.device());
    }
  }
  std::vector<char> staging;  // one tensor at a time (copy_in is done with it on return)
  for (auto& pl : plan) {
    ops::Tensor& dst = pl.which == kParam ? s.params.values[pl.index] : (pl.which == kAdamM ? s.adam_m : s.adam_v)[pl.index];
    read_tensor(rd, pl, dst, staging);
  }

  // 4. Scalars last.
  s.step = sc.step;
  s.tokens = sc.tokens;
  s.loss_ema = sc.loss_ema;
  s.scaler.scale = sc.scale;
  s.scaler.good_steps = sc.good_steps;
  s.scaler.skipped_steps = sc.skipped_steps;
  s.rng = RngState{rng[0], rng[1], rng[2], rng[3], rng[4]};
  s.loader.sample_cursor = static_cast<int64_t>(cursor[0]);
  s.loader.seed = cursor[1];
  s.recipe_yaml = std::move(recipe);
}

namespace {
// set_verify_fault_abort's substring (checkpoint.h); empty: off.
std::mutex g_verify_abort_mu;
std::string g_verify_abort;
}  // namespace

void set_verify_fault_abort(const std::string& substring) {
  std::lock_guard<std::mutex> lock(g_verify_abort_mu);
  g_verify_abort = substring;
}

void verify_checkpoint_file(const std::string& path) {
  // Fault injection (tests): a crash inside the reader, as libhdf5 crashes on some damaged files.
  {
    std::lock_guard<std::mutex> lock(g_verify_abort_mu);
    if (!g_verify_abort.empty() && path.find(g_verify_abort) != std::string::npos) std::abort();
  }
  FileReader rd(path);
  rd.state();
  for (auto& p : structure_problems(rd)) bad(path, p, kCorruptFix);
  for (auto& e : scan(rd))
    if (!e.problem.empty()) bad(path, e.problem.rfind("dataset ", 0) == 0 ? e.problem : "dataset " + e.d.path + " " + e.problem, kCorruptFix);
}

std::string read_recipe_text(const std::string& path) {
  FileReader rd(path);
  rd.state();
  return rd.text(kRecipePath);
}

int64_t read_checkpoint_step(const std::string& path) {
  FileReader rd(path);
  return rd.state().step;
}

}  // namespace runner
