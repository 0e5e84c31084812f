// The checkpoint layout's paths, order and HDF5 properties (see file_layout.h).
#include "runner/checkpoint/file_layout.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <stdexcept>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"

namespace runner::ckpt {

const char* tensor_group(int which) {
  static constexpr const char* kGroups[kTensorRoles] = {"/params", "/optimizer/adam_m", "/optimizer/adam_v"};
  RUNNER_CHECK(which >= 0 && which < kTensorRoles, fmt::format("checkpoint: no tensor tree {}", which));
  return kGroups[which];
}

std::string tensor_path(int which, const std::string& name) { return std::string(tensor_group(which)) + "/" + name; }

bool valid_tensor_name(const std::string& n) { return !n.empty() && n != "." && n.find('/') == std::string::npos; }

std::string rng_path(int rank) { return fmt::format("/rng/rank_{}", rank); }
std::string data_path(int rank) { return fmt::format("/data/rank_{}", rank); }

uint32_t state_crc(const StateScalars& s) {
  unsigned char b[64];
  auto put = [&](int i, const void* v) { std::memcpy(b + 8 * i, v, 8); };
  put(0, &s.format_version);
  put(1, &s.step);
  put(2, &s.tokens);
  put(3, &s.loss_ema);
  put(4, &s.scale);
  put(5, &s.good_steps);
  put(6, &s.skipped_steps);
  put(7, &s.world_size);
  return crc32c(0, b, sizeof b);
}

std::vector<LayoutEntry> checkpoint_layout(int world_size, const std::vector<std::string>& names) {
  for (auto& n : names) RUNNER_CHECK(valid_tensor_name(n), "parameter name '" + n + "' cannot be an HDF5 dataset name");
  std::vector<LayoutEntry> out;
  out.push_back({LayoutEntry::State, kStatePath});
  out.push_back({LayoutEntry::Recipe, kRecipePath});
  out.push_back({LayoutEntry::Names, kNamesPath});
  out.push_back({LayoutEntry::Group, kRngGroup});
  for (int r = 0; r < world_size; ++r) out.push_back({LayoutEntry::Rng, rng_path(r), r});
  out.push_back({LayoutEntry::Group, kDataGroup});
  for (int r = 0; r < world_size; ++r) out.push_back({LayoutEntry::Data, data_path(r), r});
  for (int which = 0; which < kTensorRoles; ++which) {
    if (which == kAdamM) out.push_back({LayoutEntry::Group, kOptimizerGroup});
    out.push_back({LayoutEntry::Group, tensor_group(which)});
    for (size_t i = 0; i < names.size(); ++i) out.push_back({LayoutEntry::Tensor, tensor_path(which, names[i]), 0, which, i});
  }
  return out;
}

std::string names_text(const std::vector<LayoutEntry>& layout) {
  std::string out;
  for (const LayoutEntry& e : layout)
    if (e.kind == LayoutEntry::Recipe || e.kind == LayoutEntry::Rng || e.kind == LayoutEntry::Data ||
        e.kind == LayoutEntry::Tensor)
      out += e.path + "\n";
  return out;
}

namespace {
// "rank_<r>" with r a plain decimal number below 2^31.
bool rank_name(const std::string& s) {
  if (s.size() <= 5 || s.compare(0, 5, "rank_") != 0 || s.size() > 15) return false;
  for (size_t i = 5; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return (s[5] != '0' || s.size() == 6) && std::stoll(s.substr(5)) < (int64_t{1} << 31);
}
}  // namespace

std::vector<std::string> parse_names_text(const std::string& text, std::string* problem) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto fail = [&](const std::string& why) {
    *problem = why;
    out.clear();
    return out;
  };
  problem->clear();
  if (text.empty() || text.back() != '\n') return fail("dataset /names does not end with a newline");
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    const std::string p = text.substr(start, end - start);
    start = end + 1;
    const size_t slash = p.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : p.substr(0, slash), leaf = p.substr(slash + 1);
    bool ok = p == kRecipePath || ((parent == kRngGroup || parent == kDataGroup) && rank_name(leaf));
    for (int which = 0; which < kTensorRoles && !ok; ++which) ok = parent == tensor_group(which) && valid_tensor_name(leaf);
    if (!ok) return fail(fmt::format("dataset /names lists '{}', which is not a checkpoint dataset path", p.substr(0, 120)));
    if (!seen.insert(p).second) return fail(fmt::format("dataset /names lists {} twice", p));
    out.push_back(p);
  }
  return out;
}

// The property lists: every H5Pset below is part of the format (and of the bytes a given state
// writes), so change none of them without bumping kCheckpointFormatVersion or proving the files
// unchanged.
h5::Id file_create_plist() {
  h5::Lock l;
  h5::Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  H5Pset_obj_track_times(fcpl, 0);  // no timestamps: the same state gives the same bytes
  return fcpl;
}

h5::Id group_create_plist() {
  h5::Lock l;
  h5::Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  H5Pset_obj_track_times(gcpl, 0);
  return gcpl;
}

h5::Id state_group_create_plist(hid_t group_plist) {
  h5::Lock l;
  h5::Id gcpl(H5Pcopy(group_plist), H5Pclose);
  H5Pset_attr_phase_change(gcpl, 32, 24);  // keep the attributes in the object header (compact)
  return gcpl;
}

h5::Id dataset_create_plist() {
  h5::Lock l;
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);            // one extent per dataset: H5Dget_offset
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);  // placed at creation, in creation order
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);    // every byte is written by us anyway
  H5Pset_obj_track_times(dcpl, 0);
  return dcpl;
}

h5::Id file_access_plist(void* mpi_comm) {
  h5::Lock l;
  h5::Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!mpi_comm) {
    H5Pset_fapl_sec2(fapl);  // serial driver
  } else {
#ifdef H5_HAVE_PARALLEL
    H5Pset_fapl_mpio(fapl, *static_cast<MPI_Comm*>(mpi_comm), MPI_INFO_NULL);  // collective writes
#else
    throw std::runtime_error("checkpoint: this runner's HDF5 has no parallel (MPI-IO) support; multi-rank checkpoints "
                             "need libhdf5-openmpi");
#endif
  }
  // v2 superblock and object headers (HDF5 >= 1.8 readers): metadata carries HDF5's own
  // checksums, and no "open for writing" flag can outlive a crashed writer.
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V110);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  // Atomicity comes from rename, not locks; flock also fails on some cluster file systems.
  H5Pset_file_locking(fapl, false, true);
  return fapl;
}

}  // namespace runner::ckpt
