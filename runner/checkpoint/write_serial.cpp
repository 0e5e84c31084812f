// The serial writer: one process writes the whole file (one-rank runs, and rank 0's background
// thread for asynchronous multi-rank saves), each tensor in row slabs right after creating its
// dataset, holding the HDF5 lock only per slab so the data loader's workers are never kept
// waiting long. Then the atomic protocol publishes it (publish.cpp).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/checkpoint/file_writer.h"
#include "runner/checkpoint/staging.h"
#include "runner/errors.h"

namespace runner {

namespace fs = std::filesystem;

namespace {

using namespace ckpt;

// Writes tensor datasets whole, counting the tensor bytes written (for the fault hook).
class SerialTensorWriter {
 public:
  explicit SerialTensorWriter(FileWriter& w) : w_(w) {}

  // One logical tensor. `src` holds it in `src_dtype` (nullptr: zeros); it is stored as
  // `stored` (the same dtype, or bf16 from fp32). Written in slabs of whole rows of dim 0.
  void write(const std::string& p, const std::vector<int64_t>& shape, ops::DType src_dtype, const void* src,
             ops::DType stored) {
    RUNNER_CHECK(stored == src_dtype || (src_dtype == ops::DType::F32 && stored == ops::DType::BF16),
                 "checkpoint: cannot store " + std::string(ops::dtype_name(src_dtype)) + " as " + ops::dtype_name(stored));
    const size_t esize = ops::dtype_size(stored);
    h5::Id ds = w_.create_tensor(p, shape, stored), filespace;
    {
      h5::Lock l;
      filespace = h5::Id(H5Dget_space(ds), H5Sclose);
    }
    const int rank = static_cast<int>(shape.size());
    const int64_t numel = ops::numel_of(shape);
    const int64_t rows = rank ? shape[0] : 1;
    const int64_t row_elems = rows ? numel / rows : 0;
    const int64_t rows_per_slab = row_elems ? std::max<int64_t>(1, static_cast<int64_t>(kSlabBytes / (row_elems * esize))) : 1;
    uint32_t crc = 0;
    for (int64_t r0 = 0; numel > 0 && r0 < rows; r0 += rows_per_slab) {
      fault_check_bytes(bytes_);
      const int64_t nr = std::min(rows_per_slab, rows - r0);
      const size_t elems = static_cast<size_t>(nr * row_elems);
      const void* buf = slab(src, src_dtype, stored, r0 * row_elems, elems);
      crc = crc32c(crc, buf, elems * esize);
      write_rows(ds, filespace, p, shape, stored, r0, nr, buf);
      bytes_ += static_cast<int64_t>(elems * esize);
      fault_check_bytes(bytes_);
    }
    h5::Lock l;
    w_.attr_crc(ds, crc);
    filespace.reset();
    if (!ds.close()) w_.fail("cannot close dataset " + p + " in");
  }

  int64_t bytes() const { return bytes_; }

 private:
  // `elems` elements from element `first` of the source, as stored.
  const void* slab(const void* src, ops::DType src_dtype, ops::DType stored, int64_t first, size_t elems) {
    const size_t esize = ops::dtype_size(stored);
    if (!src) {
      if (zeros_.size() < elems * esize) zeros_.assign(elems * esize, 0);
      return zeros_.data();
    }
    if (stored != src_dtype) {
      const float* f = static_cast<const float*>(src) + first;
      scratch_.resize(elems);
      for (size_t i = 0; i < elems; ++i) scratch_[i] = f32_to_bf16(f[i]);
      return scratch_.data();
    }
    return static_cast<const char*>(src) + static_cast<size_t>(first) * ops::dtype_size(src_dtype);
  }

  // Rows [r0, r0 + nr) of dim 0 (a scalar: all of it).
  void write_rows(hid_t ds, hid_t filespace, const std::string& p, const std::vector<int64_t>& shape, ops::DType stored,
                  int64_t r0, int64_t nr, const void* buf) {
    h5::Lock l;
    const int rank = static_cast<int>(shape.size());
    herr_t rc;
    if (rank == 0) {
      rc = H5Dwrite(ds, h5::file_type(stored), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    } else {
      std::vector<hsize_t> start(rank, 0), count(shape.begin(), shape.end());
      start[0] = static_cast<hsize_t>(r0);
      count[0] = static_cast<hsize_t>(nr);
      H5Sselect_hyperslab(filespace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      h5::Id mem(H5Screate_simple(rank, count.data(), nullptr), H5Sclose);
      rc = H5Dwrite(ds, h5::file_type(stored), mem, filespace, H5P_DEFAULT, buf);
    }
    if (rc < 0) w_.fail("cannot write dataset " + p + " in");
  }

  FileWriter& w_;
  int64_t bytes_ = 0;
  std::vector<uint16_t> scratch_;
  std::vector<char> zeros_;
};

// /state, /recipe, /rng and /data of a whole state.
FileHeader header_of(const TrainState& s) {
  FileHeader h;
  h.state.format_version = kCheckpointFormatVersion;
  h.state.program_version = RUNNER_VERSION;
  h.state.step = s.step;
  h.state.tokens = s.tokens;
  h.state.loss_ema = s.loss_ema;
  h.state.scale = s.scaler.scale;
  h.state.good_steps = s.scaler.good_steps;
  h.state.skipped_steps = s.scaler.skipped_steps;
  h.state.world_size = s.world_size;
  h.state.omp_threads = s.omp_threads;
  h.recipe = s.recipe_yaml;
  // One entry per rank of the writing job. The runner's RNGs are counter-based and its data
  // cursor global, so every rank's entry holds the same values today; the per-rank places are
  // the format's room for per-rank generators.
  const size_t ranks = static_cast<size_t>(std::max(1, s.world_size));
  h.rng.assign(ranks, {s.rng.init_seed, s.rng.dropout_seed, s.rng.data_seed, s.rng.sample_seed, s.rng.sample_counter});
  h.data.assign(ranks, {static_cast<uint64_t>(s.loader.sample_cursor), s.loader.seed});
  return h;
}

}  // namespace

int64_t write_checkpoint_file(const std::string& path, const TrainState& s, const WriteOptions& opt) {
  RUNNER_CHECK(s.params.names.size() == s.params.values.size(), "ParamSet names and values differ in length");
  StagedState staged(s, /*copy=*/false);  // host tensors in place; device tensors copied out
  staged.wait();
  return write_checkpoint_file(path, staged, opt);
}

int64_t write_checkpoint_file(const std::string& path, const StagedState& s, const WriteOptions& opt) {
  const std::vector<std::string>& names = s.meta().params.names;
  RUNNER_CHECK(names.size() == s.size(), "ParamSet names and values differ in length");
  const bool have_moments = s.has_moments();
  const FileHeader header = header_of(s.meta());
  const ops::DType mdt = opt.optimizer_bf16 ? ops::DType::BF16 : ops::DType::F32;
  FileWriter w(path);
  SerialTensorWriter tw(w);
  write_layout(w, header, names, [&](const LayoutEntry& e) {
    const StagedTensor& p = s.tensor(0, e.index);
    if (e.which == kParam) {
      tw.write(e.path, p.shape, p.dtype, p.data, p.dtype);
    } else if (have_moments) {
      const StagedTensor& m = s.tensor(e.which == kAdamM ? 1 : 2, e.index);
      RUNNER_CHECK(m.shape == p.shape && m.dtype == ops::DType::F32,
                   "moment of " + names[e.index] + " must be fp32 " + ops::shape_to_string(p.shape));
      tw.write(e.path, m.shape, ops::DType::F32, m.data, mdt);
    } else {
      tw.write(e.path, p.shape, ops::DType::F32, nullptr, mdt);  // zeros
    }
  });
  w.close();
  return tw.bytes();
}

SaveResult write_checkpoint_atomic(const std::string& dir, const TrainState& s, const WriteOptions& opt) {
  StagedState staged(s, /*copy=*/false);
  return write_checkpoint_atomic(dir, staged, opt);
}

SaveResult write_checkpoint_atomic(const std::string& dir, StagedState& s, const WriteOptions& opt) {
  s.wait();  // the copies out of the device have landed
  auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create directory " + dir + ": " + ec.message());
  const std::string name = checkpoint_file_name(s.meta().step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = temp_path(dir, name, ::getpid());
  ::unlink(tmp.c_str());  // a leftover of an earlier failed attempt by this process
  SaveResult r;
  r.path = final_path;
  r.step = s.meta().step;
  bool renamed = false;
  try {
    // (Multi-rank runs write one file from every rank: write_checkpoint_collective.)
    r.tensor_bytes = write_checkpoint_file(tmp, s, opt);
    publish(tmp, dir, name, opt.rank.rank == 0, &renamed);
  } catch (...) {
    if (!renamed) ::unlink(tmp.c_str());
    throw;
  }
  r.file_bytes = static_cast<int64_t>(fs::file_size(final_path, ec));
  r.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace runner
