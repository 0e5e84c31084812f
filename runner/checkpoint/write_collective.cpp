// The collective writer: every rank of a job writes its slices of each logical tensor into one
// file at once, through parallel HDF5 (MPI-IO). Contract: checkpoint.h; the format and the
// steps in prose: docs/checkpoint-format.md, "Multi-rank checkpoints".
//
// A save is this sequence of steps, each run by every rank:
//   check the tensor list -> agree on the header (rank 0's scalars and recipe, every rank's RNG
//   and data cursor) -> prepare the temporary -> create the file and every object
//   collectively, in the serial writer's order (write_layout) -> write the tensor data in
//   rounds of collective H5Dwrite -> flush -> checksum the stored bytes, reduced across ranks
//   -> write the checksums and close the file collectively -> rank 0 publishes.
// A step that fails on any rank is agreed on at its end (Agreement::settle), so that no rank is
// left waiting in a collective and nothing is published: every rank then throws, and rank 0
// removes the temporary.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <memory>

#include "parallel/comm.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/checkpoint/file_writer.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"

namespace runner {

namespace fs = std::filesystem;

namespace {

using namespace ckpt;

// Bytes of logical rows per collective write round (kSlabBytes; tests lower it to exercise
// tensors written in many rounds).
std::atomic<size_t> g_round_bytes{kSlabBytes};

// This rank's first failure, and the job-wide agreement on failures.
struct Agreement {
  bool failed = false, fault = false;
  std::string msg;
  std::exception_ptr ep;

  void capture() noexcept {  // call inside a catch block
    if (failed) return;
    failed = true;
    ep = std::current_exception();
    try {
      throw;
    } catch (const CheckpointFault& e) {
      fault = true;
      msg = e.what();
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown error";
    }
    if (msg.empty()) msg = "unknown error";
  }

  // Runs `fn`, capturing what it throws. Returns whether it threw.
  template <class Fn>
  bool attempt(Fn&& fn) noexcept {
    try {
      fn();
      return false;
    } catch (...) {
      capture();
      return true;
    }
  }

  // Collective: returns when no rank has failed; otherwise every rank throws (a failed rank its
  // own exception, the others the lowest failed rank's message).
  void settle(parallel::Communicator& comm) {
    if (comm.size() == 1) {
      if (failed) std::rethrow_exception(ep);
      return;
    }
    int64_t first = failed ? comm.rank() : comm.size();
    comm.allreduce_min(&first, 1);
    if (first == comm.size()) return;
    int64_t hdr[2] = {static_cast<int64_t>(msg.size()), fault ? 1 : 0};
    comm.broadcast(hdr, sizeof hdr, static_cast<int>(first));
    std::string text(static_cast<size_t>(hdr[0]), '\0');
    if (comm.rank() == first) text = msg;
    comm.broadcast(text.data(), text.size(), static_cast<int>(first));
    if (failed) std::rethrow_exception(ep);
    std::string m = fmt::format("checkpoint: rank {} failed: {}", first, text);
    if (hdr[1]) throw CheckpointFault(m);
    throw std::runtime_error(m);
  }
};

// Throws unless `sl` fits the logical shape of `t` (what state_shards promises).
void check_slice(const CollectiveTensor& t, const TensorSlice& sl) {
  const int nd = static_cast<int>(t.shape.size());
  const int64_t rows = t.shape[0];
  int64_t sel = 1;
  for (int k = 1; k < nd; ++k) sel *= k == sl.split_dim ? sl.count * sl.block : t.shape[static_cast<size_t>(k)];
  bool ok = sel == sl.src_row_elems && (sl.split_dim == -1 || (sl.split_dim >= 1 && sl.split_dim < nd));
  if (ok && sl.split_dim >= 1) {
    const int64_t dim = t.shape[static_cast<size_t>(sl.split_dim)];
    ok = sl.start >= 0 && sl.count >= 1 && sl.block >= 1 && sl.stride >= 1 && (sl.count == 1 || sl.stride >= sl.block) &&
         sl.start + (sl.count - 1) * sl.stride + sl.block <= dim;
  }
  int64_t prev_end = 0;
  for (auto& r : sl.runs) {
    ok = ok && r.rows >= 0 && r.src_row >= 0 && r.dst_row >= prev_end && r.dst_row + r.rows <= rows;
    prev_end = r.dst_row + r.rows;
  }
  RUNNER_CHECK(ok, "checkpoint: the slice of " + t.name + " this rank writes does not fit its logical shape " +
                       ops::shape_to_string(t.shape));
}

// The part of the slice's runs inside logical rows [r0, r1).
std::vector<SliceRun> round_pieces(const TensorSlice& sl, int64_t r0, int64_t r1) {
  std::vector<SliceRun> pieces;
  for (auto& r : sl.runs) {
    int64_t a = std::max(r0, r.dst_row), b = std::min(r1, r.dst_row + r.rows);
    if (a < b) pieces.push_back({r.src_row + (a - r.dst_row), a, b - a});
  }
  return pieces;
}

// The pieces' `elems` source elements as stored (`st`): the source itself when one fp32 piece,
// else packed into `pack` (zeros for a null source, bf16 rounded from fp32).
const void* pack_pieces(const TensorSlice& sl, const std::vector<SliceRun>& pieces, int64_t elems, ops::DType st,
                        std::vector<char>& pack) {
  static const char kNothing = 0;
  if (elems == 0) return &kNothing;
  if (pieces.size() == 1 && sl.src && st == ops::DType::F32) return sl.src + pieces[0].src_row * sl.src_row_elems;
  const size_t esize = ops::dtype_size(st);
  pack.resize(static_cast<size_t>(elems) * esize);
  char* out = pack.data();
  for (auto& p : pieces) {
    const size_t m = static_cast<size_t>(p.rows * sl.src_row_elems);
    const float* f = sl.src ? sl.src + p.src_row * sl.src_row_elems : nullptr;
    if (!f) std::memset(out, 0, m * esize);
    else if (st == ops::DType::F32) std::memcpy(out, f, m * 4);
    else
      for (size_t k = 0; k < m; ++k) {
        uint16_t b = f32_to_bf16(f[k]);
        std::memcpy(out + 2 * k, &b, 2);
      }
    out += m * esize;
  }
  return pack.data();
}

// Selects the pieces in `filespace` (none: an empty selection): each piece's rows, and within
// them all of every dim but the slice's split dim, where its (start, stride, count, block).
// False when HDF5 refuses a selection (lock held: the caller reports its error text).
bool select_pieces(hid_t filespace, const CollectiveTensor& t, const TensorSlice& sl, const std::vector<SliceRun>& pieces) {
  const size_t nd = t.shape.size();
  H5Sselect_none(filespace);
  for (size_t p = 0; p < pieces.size(); ++p) {
    std::vector<hsize_t> start(nd), stride(nd, 1), count(nd, 1), block(nd);
    start[0] = static_cast<hsize_t>(pieces[p].dst_row);
    block[0] = static_cast<hsize_t>(pieces[p].rows);
    for (size_t k = 1; k < nd; ++k) {
      if (static_cast<int>(k) == sl.split_dim) {
        start[k] = static_cast<hsize_t>(sl.start);
        stride[k] = static_cast<hsize_t>(std::max<int64_t>(sl.stride, 1));
        count[k] = static_cast<hsize_t>(sl.count);
        block[k] = static_cast<hsize_t>(sl.block);
      } else {
        start[k] = 0;
        block[k] = static_cast<hsize_t>(t.shape[k]);
      }
    }
    if (H5Sselect_hyperslab(filespace, p == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), stride.data(), count.data(),
                            block.data()) < 0)
      return false;
  }
  return true;
}

// CRC-32C of `bytes` stored bytes at `offset` of the open file `fd`; false when they cannot be read.
bool crc_of_stored(int fd, haddr_t offset, uint64_t bytes, std::vector<char>& buf, uint32_t* crc_out) {
  buf.resize(static_cast<size_t>(std::min<uint64_t>(bytes, kReadChunkBytes)));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < bytes;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(bytes - done, kReadChunkBytes));
    ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    crc = crc32c(crc, buf.data(), static_cast<size_t>(r));
    done += static_cast<uint64_t>(r);
  }
  *crc_out = crc;
  return true;
}

// One collective save: its inputs, what the steps share, and the steps.
class CollectiveSave {
 public:
  CollectiveSave(parallel::Communicator& comm, std::string dir, const std::vector<CollectiveTensor>& tensors,
                 const std::function<TensorSlice(int which, size_t i)>& slice, const WriteOptions& opt)
      : comm_(comm),
        rank_(comm.rank()),
        size_(comm.size()),
        mpi_comm_(parallel::mpi_handle(comm)),
        dir_(std::move(dir)),
        tensors_(tensors),
        slice_(slice),
        moment_dtype_(opt.optimizer_bf16 ? ops::DType::BF16 : ops::DType::F32) {}

  SaveResult run(const TrainState& s) {
    check_tensor_list();
    agree_on_header(s);
    prepare_temporary();
    SaveResult res;
    res.path = final_path_;
    res.step = header_.state.step;
    res.tensor_bytes = tensor_bytes();
    bool renamed = false;
    try {
      create_file();
      write_tensor_data();
      flush_file();
      close_file(checksums());
      res.file_bytes = publish_on_rank0(&renamed);
    } catch (...) {
      ds_.clear();  // the datasets, then the file (collectively: every rank throws at the same step)
      w_.reset();
      if (rank_ == 0 && !renamed) ::unlink(tmp_.c_str());
      throw;
    }
    return res;
  }

 private:
  ops::DType stored(int which) const { return which == kParam ? ops::DType::F32 : moment_dtype_; }
  const CollectiveTensor& tensor_of(size_t k) const { return tensors_[k % tensors_.size()]; }
  int which_of(size_t k) const { return static_cast<int>(k / tensors_.size()); }

  // Step 1: the list every rank was given (identical on every rank, by contract) is writable.
  void check_tensor_list() const {
    RUNNER_CHECK(mpi_comm_ || size_ == 1, "write_checkpoint_collective: a multi-rank communicator must be an MPI one");
    for (auto& t : tensors_) {
      RUNNER_CHECK(valid_tensor_name(t.name), "parameter name '" + t.name + "' cannot be an HDF5 dataset name");
      RUNNER_CHECK(!t.shape.empty(), "checkpoint tensor " + t.name + " has no dimensions");
      for (auto d : t.shape) RUNNER_CHECK(d >= 0, "checkpoint tensor " + t.name + " has a negative dimension");
    }
  }

  // Step 2: /state and /recipe hold rank 0's scalars and recipe (broadcast; the step names the
  // file); /rng/rank_<r> and /data/rank_<r> rank r's own words (all-gathered).
  void agree_on_header(const TrainState& s) {
    struct Scalars {
      int64_t step, tokens, good_steps, skipped_steps, recipe_bytes;
      double loss_ema, scale;
    } h{s.step, s.tokens, s.scaler.good_steps, s.scaler.skipped_steps, static_cast<int64_t>(s.recipe_yaml.size()),
        s.loss_ema, s.scaler.scale};
    comm_.broadcast(&h, sizeof h, 0);
    header_.recipe = rank_ == 0 ? s.recipe_yaml : std::string(static_cast<size_t>(h.recipe_bytes), '\0');
    comm_.broadcast(header_.recipe.data(), header_.recipe.size(), 0);
    StateScalars& sc = header_.state;
    sc.format_version = kCheckpointFormatVersion;
    sc.program_version = RUNNER_VERSION;
    sc.step = h.step;
    sc.tokens = h.tokens;
    sc.loss_ema = h.loss_ema;
    sc.scale = h.scale;
    sc.good_steps = h.good_steps;
    sc.skipped_steps = h.skipped_steps;
    sc.world_size = size_;
    sc.omp_threads = s.omp_threads;
    name_ = checkpoint_file_name(h.step);
    final_path_ = (fs::path(dir_) / name_).string();
    rng_words_ = {s.rng.init_seed, s.rng.dropout_seed, s.rng.data_seed, s.rng.sample_seed, s.rng.sample_counter};
    data_words_ = {static_cast<uint64_t>(s.loader.sample_cursor), s.loader.seed};
  }

  // Step 3: rank 0 prepares the directory; the temporary's name is rank 0's (its pid). Then
  // every rank's RNG words and data cursor are gathered into the header.
  void prepare_temporary() {
    int64_t pid = rank_ == 0 ? static_cast<int64_t>(::getpid()) : 0;
    comm_.allreduce_sum(&pid, 1);
    tmp_ = temp_path(dir_, name_, pid);
    if (rank_ == 0) {
      err_.attempt([&] {
        std::error_code ec;
        fs::create_directories(dir_, ec);
        if (ec) throw std::runtime_error("checkpoint: cannot create directory " + dir_ + ": " + ec.message());
        ::unlink(tmp_.c_str());  // a leftover of an earlier failed attempt by this process
      });
    }
    err_.settle(comm_);
    gather_rank_entries();
  }

  void gather_rank_entries() {
    constexpr int kWords = kRngWords + kDataWords;
    std::vector<int64_t> table(static_cast<size_t>(size_) * kWords, 0);
    std::memcpy(&table[static_cast<size_t>(rank_) * kWords], rng_words_.data(), sizeof rng_words_);
    std::memcpy(&table[static_cast<size_t>(rank_) * kWords + kRngWords], data_words_.data(), sizeof data_words_);
    comm_.allreduce_sum(table.data(), static_cast<int64_t>(table.size()));  // one nonzero term each: exact
    header_.rng.resize(static_cast<size_t>(size_));
    header_.data.resize(static_cast<size_t>(size_));
    for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
      std::memcpy(header_.rng[r].data(), &table[r * kWords], sizeof rng_words_);
      std::memcpy(header_.data[r].data(), &table[r * kWords + kRngWords], sizeof data_words_);
    }
  }

  int64_t tensor_bytes() const {
    int64_t n = 0;
    for (int which = 0; which < kTensorRoles; ++which)
      for (auto& t : tensors_) n += ops::numel_of(t.shape) * static_cast<int64_t>(ops::dtype_size(stored(which)));
    return n;
  }

  // Step 4: the file and every object in it, collectively, in the serial writer's order; the
  // tensor datasets are created empty (ds_[which * n + i]).
  void create_file() {
    err_.attempt([&] { w_ = std::make_unique<FileWriter>(tmp_, mpi_comm_, rank_ == 0); });
    err_.settle(comm_);
    std::vector<std::string> names;
    for (auto& t : tensors_) names.push_back(t.name);
    err_.attempt([&] {
      write_layout(*w_, header_, names, [&](const LayoutEntry& e) {
        ds_.push_back(w_->create_tensor(e.path, tensors_[e.index].shape, stored(e.which)));
      });
    });
    err_.settle(comm_);
  }

  // Step 5: each dataset in rounds of at most g_round_bytes of logical rows; every rank takes
  // part in every round's collective H5Dwrite, selecting its part of those rows or nothing.
  void write_tensor_data() {
    {
      h5::Lock l;
      dxpl_ = h5::Id(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
      if (mpi_comm_) H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE);
#endif
    }
    for (int which = 0; which < kTensorRoles; ++which)
      for (size_t i = 0; i < tensors_.size(); ++i) write_tensor(which, i);
  }

  // What this rank writes of dataset (which, i): slice() is always called, since it may run
  // collectives of its own; a failed rank keeps taking part, writing nothing.
  TensorSlice take_slice(int which, size_t i) {
    TensorSlice sl;
    err_.attempt([&] {
      sl = slice_(which, i);
      if (!sl.runs.empty() && !err_.failed) check_slice(tensors_[i], sl);
    });
    if (err_.failed) sl.runs.clear();
    return sl;
  }

  void write_tensor(int which, size_t i) {
    const CollectiveTensor& t = tensors_[i];
    hid_t d = ds_[static_cast<size_t>(which) * tensors_.size() + i];
    const ops::DType st = stored(which);
    const size_t esize = ops::dtype_size(st);
    const int64_t rows = t.shape[0], numel = ops::numel_of(t.shape);
    const int64_t row_elems = rows ? numel / rows : 0;
    const TensorSlice sl = take_slice(which, i);
    h5::Id filespace;
    {
      h5::Lock l;
      filespace = h5::Id(H5Dget_space(d), H5Sclose);
    }
    const size_t round_bytes = g_round_bytes.load();
    const int64_t per_round = row_elems ? std::max<int64_t>(1, static_cast<int64_t>(round_bytes / (row_elems * esize))) : 1;
    for (int64_t r0 = 0; numel > 0 && r0 < rows; r0 += per_round) {
      std::vector<SliceRun> pieces = round_pieces(sl, r0, std::min(rows, r0 + per_round));
      if (err_.attempt([&] {
            if (!pieces.empty()) fault_check_bytes(written_);
          }))
        pieces.clear();
      write_round(which, t, sl, d, filespace, pieces);
    }
  }

  // One collective H5Dwrite: this rank's pieces of the round's rows (maybe none).
  void write_round(int which, const CollectiveTensor& t, const TensorSlice& sl, hid_t d, hid_t filespace,
                   const std::vector<SliceRun>& pieces) {
    const ops::DType st = stored(which);
    int64_t elems = 0;
    for (auto& p : pieces) elems += p.rows * sl.src_row_elems;
    const void* buf = pack_pieces(sl, pieces, elems, st, pack_);
    err_.attempt([&] {
      h5::Lock l;
      if (!select_pieces(filespace, t, sl, pieces))
        w_->fail("cannot select this rank's slice of dataset " + tensor_path(which, t.name) + " in");
      hsize_t mdim = static_cast<hsize_t>(std::max<int64_t>(elems, 1));
      h5::Id mem(H5Screate_simple(1, &mdim, nullptr), H5Sclose);
      if (elems == 0) H5Sselect_none(mem);
      if (H5Dwrite(d, h5::file_type(st), mem, filespace, dxpl_, buf) < 0)
        w_->fail("cannot write dataset " + tensor_path(which, t.name) + " in");
    });
    written_ += elems * static_cast<int64_t>(ops::dtype_size(st));
    err_.attempt([&] {
      if (elems > 0) fault_check_bytes(written_);
    });
  }

  // Step 6: every rank's bytes on disk before anyone reads them back.
  void flush_file() {
    err_.attempt([&] { w_->flush(); });
    err_.settle(comm_);  // an all-reduce: every rank has flushed once it returns
  }

  // Step 7: checksums of the tensor datasets' stored bytes, read back (dataset k by rank
  // k % size) and all-reduced, so every rank holds all of them.
  std::vector<int64_t> checksums() {
    std::vector<int64_t> crcs(ds_.size(), 0);
    err_.attempt([&] {
      std::vector<haddr_t> offsets(ds_.size(), HADDR_UNDEF);
      {
        h5::Lock l;
        for (size_t k = 0; k < ds_.size(); ++k) offsets[k] = H5Dget_offset(ds_[k]);
        h5::clear_errors();
      }
      int fd = -1;
      std::vector<char> buf;
      for (size_t k = static_cast<size_t>(rank_); k < ds_.size(); k += static_cast<size_t>(size_)) {
        const CollectiveTensor& t = tensor_of(k);
        const uint64_t bytes = static_cast<uint64_t>(ops::numel_of(t.shape)) * ops::dtype_size(stored(which_of(k)));
        if (bytes == 0) continue;
        const std::string p = tensor_path(which_of(k), t.name);
        if (offsets[k] == HADDR_UNDEF) throw std::runtime_error("checkpoint: dataset " + p + " has no storage in " + tmp_);
        if (fd < 0) {
          fd = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
          if (fd < 0) throw std::runtime_error(sys_error("cannot open for reading", tmp_));
        }
        uint32_t crc = 0;
        if (!crc_of_stored(fd, offsets[k], bytes, buf, &crc)) {
          std::string e = sys_error("cannot read back dataset " + p + " of", tmp_);
          ::close(fd);
          throw std::runtime_error(e);
        }
        crcs[k] = crc;
      }
      if (fd >= 0) ::close(fd);
    });
    comm_.allreduce_sum(crcs.data(), static_cast<int64_t>(crcs.size()));  // one nonzero term each
    err_.settle(comm_);
    return crcs;
  }

  // Step 8: identical checksum attributes on every rank, then a collective close.
  void close_file(const std::vector<int64_t>& crcs) {
    err_.attempt([&] {
      for (size_t k = 0; k < ds_.size(); ++k) {
        w_->attr_crc(ds_[k], static_cast<uint32_t>(crcs[k]));
        if (!ds_[k].close()) {
          h5::Lock l;
          w_->fail("cannot close dataset " + tensor_path(which_of(k), tensor_of(k).name) + " in");
        }
      }
      ds_.clear();
      dxpl_.reset();
      w_->close();
    });
    err_.settle(comm_);
    w_.reset();
  }

  // Step 9: rank 0 verifies, fsyncs, renames, fsyncs the directory, writes LATEST. Returns the
  // file's size on every rank.
  int64_t publish_on_rank0(bool* renamed) {
    int64_t file_bytes = 0;
    if (rank_ == 0) {
      err_.attempt([&] {
        publish(tmp_, dir_, name_, true, renamed);
        std::error_code ec;
        file_bytes = static_cast<int64_t>(fs::file_size(final_path_, ec));
      });
    }
    err_.settle(comm_);
    comm_.allreduce_sum(&file_bytes, 1);
    return file_bytes;
  }

  parallel::Communicator& comm_;
  const int rank_, size_;
  void* const mpi_comm_;
  const std::string dir_;
  const std::vector<CollectiveTensor>& tensors_;
  const std::function<TensorSlice(int, size_t)>& slice_;
  const ops::DType moment_dtype_;

  Agreement err_;
  FileHeader header_;
  std::array<uint64_t, kRngWords> rng_words_{};  // this rank's
  std::array<uint64_t, kDataWords> data_words_{};
  std::string name_, final_path_, tmp_;
  std::unique_ptr<FileWriter> w_;
  std::vector<h5::Id> ds_;  // declared after w_: destroyed (closed) before the file
  h5::Id dxpl_;
  std::vector<char> pack_;
  int64_t written_ = 0;     // tensor bytes this rank has written (the fault hook counts them)
};

}  // namespace

// Test hook (not in the header: tests declare it): bytes per collective write round; 0 restores
// the default.
namespace testing {
void set_checkpoint_round_bytes(size_t n) { g_round_bytes.store(n ? n : kSlabBytes); }
}  // namespace testing

SaveResult write_checkpoint_collective(parallel::Communicator& comm, const std::string& dir, const TrainState& s,
                                       const std::vector<CollectiveTensor>& tensors,
                                       const std::function<TensorSlice(int which, size_t i)>& slice,
                                       const WriteOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  SaveResult res = CollectiveSave(comm, dir, tensors, slice, opt).run(s);
  res.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace runner
