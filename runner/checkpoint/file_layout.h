// The checkpoint file's layout, described once (docs/checkpoint-format.md is its prose):
// every group and dataset path, /state's attributes and checksum, the per-rank RNG and data
// entries, the tensor trees, the order in which a writer creates all of them, and the HDF5
// properties they are created and opened with. The serial writer, the collective writer, the
// reader, the verifier and `runner inspect` all take their paths and order from here, so the
// format is encoded in one file.
//
// Internal to runner/checkpoint/.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runner/hdf5/hdf5.h"

namespace runner::ckpt {

// ---- paths ----
inline constexpr const char* kStatePath = "/state";
inline constexpr const char* kRecipePath = "/recipe";
// Format 2: every other dataset's path, one per line in creation order (a fixed-length string
// with a crc32c, like /recipe), so readers open the datasets by name and never iterate a group.
inline constexpr const char* kNamesPath = "/names";
inline constexpr const char* kRngGroup = "/rng";
inline constexpr const char* kDataGroup = "/data";
inline constexpr const char* kParamsGroup = "/params";
inline constexpr const char* kOptimizerGroup = "/optimizer";

// The three tensor trees, mirrored name for name. The numbers are the `which` of
// write_checkpoint_collective's slice callback.
enum TensorRole : int { kParam = 0, kAdamM = 1, kAdamV = 2 };
constexpr int kTensorRoles = 3;
const char* tensor_group(int which);                                // "/params", "/optimizer/adam_m", ...
std::string tensor_path(int which, const std::string& name);       // "/optimizer/adam_m/h.0.mlp.fc.weight"
bool valid_tensor_name(const std::string& name);                   // usable as one link name

// Per-rank entries: /rng/rank_<r> (uint64[5]) and /data/rank_<r> (uint64[2]), each with an
// attribute `fields` naming its words.
constexpr int kRngWords = 5;   // init_seed, dropout_seed, data_seed, sample_seed, sample_counter
constexpr int kDataWords = 2;  // sample_cursor, seed
inline constexpr const char* kRngFields = "init_seed,dropout_seed,data_seed,sample_seed,sample_counter";
inline constexpr const char* kDataFields = "sample_cursor,seed";
std::string rng_path(int rank);
std::string data_path(int rank);

// Attributes of every tensor dataset (and `crc32c` of /recipe and the per-rank datasets).
inline constexpr const char* kDtypeAttr = "dtype";
inline constexpr const char* kCrcAttr = "crc32c";
inline constexpr const char* kFieldsAttr = "fields";

// ---- /state ----
struct StateScalars {
  int64_t format_version = 0, step = 0, tokens = 0;
  double loss_ema = 0, scale = 1;
  int64_t good_steps = 0, skipped_steps = 0, world_size = 1;
  std::string program_version;
  // OpenMP threads per rank of the run that wrote the file (its losses depend on it: the
  // reductions split by thread). Outside the checksum and optional: 0 in files from before it.
  int64_t omp_threads = 0;
};
inline constexpr const char* kThreadsAttr = "omp_threads";

// /state's attributes in creation order, each as f(name, field&) with the field an int64_t,
// double or std::string; the crc32c attribute (state_crc) follows them.
template <class S, class F>
void for_each_state_field(S& s, F&& f) {
  f("format_version", s.format_version);
  f("program_version", s.program_version);
  f("step", s.step);
  f("tokens", s.tokens);
  f("loss_ema", s.loss_ema);
  f("loss_scale", s.scale);
  f("good_steps", s.good_steps);
  f("skipped_steps", s.skipped_steps);
  f("world_size", s.world_size);
}

// CRC-32C of the eight numbers packed little-endian in this order (Python:
// struct.pack('<qqqddqqq', format_version, step, tokens, loss_ema, loss_scale, good_steps,
// skipped_steps, world_size)); program_version is not covered.
uint32_t state_crc(const StateScalars& s);

// ---- the order of creation ----
// One object of the file. Writers create the objects in exactly this order (it decides where
// each dataset's bytes land, and h5ls/inspect list by creation order).
struct LayoutEntry {
  enum Kind { Group, State, Recipe, Names, Rng, Data, Tensor } kind;
  std::string path;
  int rank = 0;      // Rng, Data: whose entry
  int which = 0;     // Tensor: its tree (TensorRole)
  size_t index = 0;  // Tensor: its index in `names`
};

// /state, /recipe, /names, /rng and its rank_0..rank_{world-1}, /data and its ranks, /params and each
// parameter in `names` order, /optimizer, /optimizer/adam_m and each moment, /optimizer/adam_v
// and each moment. Aborts (an internal error) on a name that cannot be a dataset name.
std::vector<LayoutEntry> checkpoint_layout(int world_size, const std::vector<std::string>& names);

// What /names holds for a layout: the path of every dataset but /state (a group) and /names
// itself, in creation order, each followed by '\n'.
std::string names_text(const std::vector<LayoutEntry>& layout);
// The paths of a /names text, each checked to be one a checkpoint may hold (/recipe,
// /rng/rank_<r>, /data/rank_<r>, or a tensor of the three trees with a valid name) and listed
// once; a problem comes back in *problem (and the list is then empty).
std::vector<std::string> parse_names_text(const std::string& text, std::string* problem);

// ---- HDF5 properties ----
// File creation: link creation order tracked and indexed, no timestamps.
h5::Id file_create_plist();
// Groups: link creation order tracked and indexed, no timestamps.
h5::Id group_create_plist();
// /state: a group's properties with its attributes kept compact in the object header.
h5::Id state_group_create_plist(hid_t group_plist);
// Tensor and small datasets: contiguous (one extent: H5Dget_offset), allocated at creation in
// creation order, never filled (every byte is written), no timestamps. No chunks, no filters.
h5::Id dataset_create_plist();
// File access, for writing and for reading: the serial (sec2) driver, or MPI-IO over the
// MPI_Comm `mpi_comm` points to; v18..v110 object headers (metadata checksums, no "open for
// writing" flag that outlives a crash); strong close; no file locking (atomicity comes from
// rename).
h5::Id file_access_plist(void* mpi_comm = nullptr);

}  // namespace runner::ckpt
