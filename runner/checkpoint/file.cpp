// The checkpoint file: HDF5 layout, atomic publication, verification, inspection.
// Layout and guarantees: docs/checkpoint-format.md; the design in checkpoint.h.
//
// Writing goes through HDF5 (so the file is ordinary HDF5 that h5py reads) in row slabs of
// each tensor, holding the process-wide HDF5 lock only per slab. Reading trusts HDF5 for
// metadata alone: each dataset must be contiguous with storage = shape x type size inside
// the file, and its bytes are then read with pread in bounded pieces and checksummed. A file
// from elsewhere can claim any shape or size; nothing is allocated from its claims.
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <set>

#include "parallel/comm.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/data/internal.h"
#include "runner/errors.h"

namespace runner {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little,
              "checkpoint datasets are little-endian and checksummed as stored; a big-endian host needs byte swaps");

namespace {

constexpr size_t kSlabBytes = 16u << 20;          // write granularity (HDF5 lock held per slab)
constexpr size_t kReadChunkBytes = 16u << 20;     // pread granularity when verifying
constexpr size_t kMaxRecipeBytes = 64u << 20;     // an untrusted file cannot make us allocate more
constexpr size_t kMaxStringAttrBytes = 1u << 20;
constexpr const char* kRngFields = "init_seed,dropout_seed,data_seed,sample_seed,sample_counter";
constexpr const char* kDataFields = "sample_cursor,seed";

// ---------------------------------------------------------------------------------------
// The HDF5 lock. The library is not thread-safe here; every call holds data_detail::hdf5_mutex().
// Re-entrant per thread (a depth count), so RAII handles can close under an outer lock. The
// outermost holder also silences HDF5's automatic error printing: failures are turned into
// our own messages (h5_error_text).
thread_local int t_h5_depth = 0;

class H5Lock {
 public:
  H5Lock() {
    if (t_h5_depth++ == 0) {
      data_detail::hdf5_mutex().lock();
      H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
  }
  ~H5Lock() {
    if (--t_h5_depth == 0) {
      H5Eset_auto2(H5E_DEFAULT, func_, data_);
      data_detail::hdf5_mutex().unlock();
    }
  }
  H5Lock(const H5Lock&) = delete;
  H5Lock& operator=(const H5Lock&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer c) : id_(id), close_(c) {}
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~H5Id() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }
  bool close() {  // explicit close reporting success (a file's close flushes it)
    bool good = true;
    if (id_ >= 0) {
      H5Lock l;
      good = close_(id_) >= 0;
    }
    id_ = -1;
    return good;
  }
  void reset() { close(); }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// The most specific message on HDF5's error stack (call with the lock held, right after the
// failing call), then clears the stack.
std::string h5_error_text() {
  std::vector<std::string> msgs;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e && e->desc && *e->desc) static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
        return 0;
      },
      &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return "no detail from HDF5";
  std::string s = msgs[0];
  if (msgs.size() > 1 && msgs[1] != msgs[0]) s += "; " + msgs[1];
  return s;
}

std::string sys_error(const std::string& what, const std::string& path) {
  return fmt::format("checkpoint: {} {}: {}", what, path, std::strerror(errno));
}

// ---------------------------------------------------------------------------------------
// Fault injection.
std::atomic<int64_t> g_fault_bytes{-2};  // -2: not set by a call (use the environment); -1: off
std::atomic<int> g_fault_stage{static_cast<int>(WriteFault::None)};

int64_t fault_limit() {
  int64_t v = g_fault_bytes.load();
  if (v != -2) return v;
  const char* e = std::getenv("RUNNER_CKPT_FAULT_AFTER_BYTES");
  return e && *e ? std::strtoll(e, nullptr, 10) : -1;
}

[[noreturn]] void trigger_fault(const std::string& where) {
  const char* e = std::getenv("RUNNER_CKPT_FAULT_EXIT");
  if (e && std::strcmp(e, "1") == 0) ::_exit(137);
  throw CheckpointFault("injected checkpoint write fault " + where);
}

void fault_check_bytes(int64_t written) {
  int64_t limit = fault_limit();
  if (limit >= 0 && written >= limit) trigger_fault(fmt::format("after {} bytes of tensor data", written));
}

void fault_check_stage(WriteFault f) {
  if (static_cast<int>(f) == g_fault_stage.load()) trigger_fault(fmt::format("at stage {}", static_cast<int>(f)));
}

// ---------------------------------------------------------------------------------------
// Types. Tensors are stored in their own dtype; 16-bit floats as uint16 with a dtype attribute.
hid_t h5_type(ops::DType t) {  // lock held (the H5T_* macros may initialise the library)
  switch (t) {
    case ops::DType::F32: return H5T_IEEE_F32LE;
    case ops::DType::F64: return H5T_IEEE_F64LE;
    case ops::DType::I32: return H5T_STD_I32LE;
    case ops::DType::BF16:
    case ops::DType::F16:
    case ops::DType::U16: return H5T_STD_U16LE;
    case ops::DType::U8: return H5T_STD_U8LE;
  }
  return H5T_IEEE_F32LE;
}

// "float32", "uint64", "float32be", "str[79]": short enough for inspect's dtype column.
std::string describe_h5_type(hid_t t) {  // lock held
  size_t size = H5Tget_size(t);
  const char* be = H5Tget_order(t) == H5T_ORDER_BE ? "be" : "";
  switch (H5Tget_class(t)) {
    case H5T_FLOAT: return fmt::format("float{}{}", 8 * size, be);
    case H5T_INTEGER: return fmt::format("{}int{}{}", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", 8 * size, be);
    case H5T_STRING: return H5Tis_variable_str(t) > 0 ? "vlen-str" : fmt::format("str[{}]", size);
    case H5T_COMPOUND: return "compound";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_ENUM: return "enum";
    case H5T_REFERENCE: return "reference";
    case H5T_OPAQUE: return "opaque";
    default: return "unknown type";
  }
}

uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

bool valid_name(const std::string& n) { return !n.empty() && n != "." && n.find('/') == std::string::npos; }

// ---------------------------------------------------------------------------------------
// /state scalars and their checksum.
struct StateScalars {
  int64_t format_version = 0, step = 0, tokens = 0;
  double loss_ema = 0, scale = 1;
  int64_t good_steps = 0, skipped_steps = 0, world_size = 1;
  std::string program_version;
};

// The checksum covers these eight values packed little-endian in this order:
// struct.pack('<qqqddqqq', format_version, step, tokens, loss_ema, loss_scale, good_steps,
// skipped_steps, world_size) in Python.
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

// ---------------------------------------------------------------------------------------
// Writing.
//
// FileWriter writes the layout. Serially (the default) it writes everything. Collectively
// (`mpi_comm`: a pointer to an MPI_Comm, every rank of it constructing the same FileWriter and
// making the same calls with the same arguments) it opens the file through parallel HDF5's
// MPI-IO driver; the small datasets' bytes are then written by the rank given `write_small`
// only, and tensor datasets are created empty (create_tensor) for the ranks to fill.
class FileWriter {
 public:
  explicit FileWriter(std::string path, void* mpi_comm = nullptr, bool write_small = true)
      : path_(std::move(path)), write_small_(write_small) {
    H5Lock l;
    H5Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Pset_obj_track_times(fcpl, 0);  // no timestamps: the same state gives the same bytes
    H5Id fapl = make_fapl(mpi_comm);
    file_ = H5Id(H5Fcreate(path_.c_str(), H5F_ACC_EXCL, fcpl, fapl), H5Fclose);
    if (!file_.ok()) fail("cannot create");
    gcpl_ = H5Id(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    H5Pset_link_creation_order(gcpl_, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Pset_obj_track_times(gcpl_, 0);
    dcpl_ = H5Id(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(dcpl_, H5D_CONTIGUOUS);              // one extent per dataset: H5Dget_offset
    H5Pset_alloc_time(dcpl_, H5D_ALLOC_TIME_EARLY);    // placed at creation, in creation order
    H5Pset_fill_time(dcpl_, H5D_FILL_TIME_NEVER);      // every byte is written by us anyway
    H5Pset_obj_track_times(dcpl_, 0);
  }

  static H5Id make_fapl(void* mpi_comm = nullptr) {  // lock held
    H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
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

  void group(const std::string& p) {
    H5Lock l;
    H5Id g(H5Gcreate2(file_, p.c_str(), H5P_DEFAULT, gcpl_, H5P_DEFAULT), H5Gclose);
    if (!g.ok()) fail("cannot create group " + p + " in");
  }

  // /state: scalars as attributes, plus their crc32c.
  void state(const StateScalars& s) {
    H5Lock l;
    H5Id gcpl(H5Pcopy(gcpl_), H5Pclose);
    H5Pset_attr_phase_change(gcpl, 32, 24);  // keep the attributes in the object header (compact)
    H5Id g(H5Gcreate2(file_, "/state", H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
    if (!g.ok()) fail("cannot create /state in");
    attr_i64(g, "format_version", s.format_version);
    attr_str(g, "program_version", s.program_version);
    attr_i64(g, "step", s.step);
    attr_i64(g, "tokens", s.tokens);
    attr_f64(g, "loss_ema", s.loss_ema);
    attr_f64(g, "loss_scale", s.scale);
    attr_i64(g, "good_steps", s.good_steps);
    attr_i64(g, "skipped_steps", s.skipped_steps);
    attr_i64(g, "world_size", s.world_size);
    attr_u32(g, "crc32c", state_crc(s));
  }

  void u64_array(const std::string& p, const std::vector<uint64_t>& v, const char* fields) {
    H5Lock l;
    hsize_t n = v.size();
    H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    H5Id ds(H5Dcreate2(file_, p.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
    if (!ds.ok() || (write_small_ && H5Dwrite(ds, H5T_STD_U64LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0))
      fail("cannot write " + p + " in");
    attr_str(ds, "fields", fields);
    attr_u32(ds, "crc32c", crc32c(0, v.data(), v.size() * 8));
  }

  // A fixed-length string (NUL-padded), so h5dump prints it and its bytes are contiguous.
  void text(const std::string& p, const std::string& s) {
    H5Lock l;
    std::string stored = s.empty() ? std::string(1, '\0') : s;
    H5Id type = str_type(stored.size());
    H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
    H5Id ds(H5Dcreate2(file_, p.c_str(), type, space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
    if (!ds.ok() || (write_small_ && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data()) < 0))
      fail("cannot write " + p + " in");
    attr_u32(ds, "crc32c", crc32c(0, stored.data(), stored.size()));
  }

  // An empty tensor dataset stored as `stored` (contiguous, allocated now), with its dtype
  // attribute; the caller writes its bytes and then its crc32c (attr_crc).
  H5Id create_tensor(const std::string& p, const std::vector<int64_t>& shape, ops::DType stored) {
    H5Lock l;
    const int rank = static_cast<int>(shape.size());
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    H5Id space(rank ? H5Screate_simple(rank, dims.data(), nullptr) : H5Screate(H5S_SCALAR), H5Sclose);
    H5Id ds(H5Dcreate2(file_, p.c_str(), h5_type(stored), space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) fail("cannot create dataset " + p + " in");
    attr_str(ds, "dtype", ops::dtype_name(stored));
    return ds;
  }

  void attr_crc(hid_t ds, uint32_t crc) {
    H5Lock l;
    attr_u32(ds, "crc32c", crc);
  }

  // One logical tensor. `src` holds it in `src_dtype` (nullptr: zeros); it is stored as
  // `stored` (the same dtype, or bf16 from fp32). Written in slabs of whole rows of dim 0.
  // (Multi-rank checkpoints: write_checkpoint_collective writes the shards' slices instead.)
  void tensor(const std::string& p, const std::vector<int64_t>& shape, ops::DType src_dtype, const void* src,
              ops::DType stored) {
    RUNNER_CHECK(stored == src_dtype || (src_dtype == ops::DType::F32 && stored == ops::DType::BF16),
                 "checkpoint: cannot store " + std::string(ops::dtype_name(src_dtype)) + " as " + ops::dtype_name(stored));
    const size_t esize = ops::dtype_size(stored), src_esize = ops::dtype_size(src_dtype);
    const int rank = static_cast<int>(shape.size());
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    H5Id ds = create_tensor(p, shape, stored), filespace;
    {
      H5Lock l;
      filespace = H5Id(H5Dget_space(ds), H5Sclose);
    }
    const int64_t numel = ops::numel_of(shape);
    const int64_t rows = rank ? shape[0] : 1;
    const int64_t row_elems = rows ? numel / rows : 0;
    const int64_t rows_per_slab = row_elems ? std::max<int64_t>(1, static_cast<int64_t>(kSlabBytes / (row_elems * esize))) : 1;
    uint32_t crc = 0;
    for (int64_t r0 = 0; numel > 0 && r0 < rows; r0 += rows_per_slab) {
      fault_check_bytes(tensor_bytes_);
      const int64_t nr = std::min(rows_per_slab, rows - r0);
      const size_t elems = static_cast<size_t>(nr * row_elems);
      const void* buf;
      if (!src) {
        if (zeros_.size() < elems * esize) zeros_.assign(elems * esize, 0);
        buf = zeros_.data();
      } else if (stored != src_dtype) {
        const float* f = static_cast<const float*>(src) + r0 * row_elems;
        scratch_.resize(elems);
        for (size_t i = 0; i < elems; ++i) scratch_[i] = f32_to_bf16(f[i]);
        buf = scratch_.data();
      } else {
        buf = static_cast<const char*>(src) + static_cast<size_t>(r0 * row_elems) * src_esize;
      }
      crc = crc32c(crc, buf, elems * esize);
      {
        H5Lock l;
        herr_t rc;
        if (rank == 0) {
          rc = H5Dwrite(ds, h5_type(stored), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        } else {
          std::vector<hsize_t> start(rank, 0), count(dims);
          start[0] = static_cast<hsize_t>(r0);
          count[0] = static_cast<hsize_t>(nr);
          H5Sselect_hyperslab(filespace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
          H5Id mem(H5Screate_simple(rank, count.data(), nullptr), H5Sclose);
          rc = H5Dwrite(ds, h5_type(stored), mem, filespace, H5P_DEFAULT, buf);
        }
        if (rc < 0) fail("cannot write dataset " + p + " in");
      }
      tensor_bytes_ += static_cast<int64_t>(elems * esize);
      fault_check_bytes(tensor_bytes_);
    }
    H5Lock l;
    attr_u32(ds, "crc32c", crc);
    filespace.reset();
    if (!ds.close()) fail("cannot close dataset " + p + " in");
  }

  void close() {
    {
      H5Lock l;
      if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail("cannot flush");
    }
    fault_check_stage(WriteFault::BeforeClose);
    gcpl_.reset();
    dcpl_.reset();
    H5Lock l;
    if (!file_.close()) fail("cannot close");
  }

  int64_t tensor_bytes() const { return tensor_bytes_; }
  hid_t file() const { return file_.get(); }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) {  // lock held
    throw std::runtime_error(fmt::format("checkpoint: {} {} ({})", what, path_, h5_error_text()));
  }

 private:
  H5Id str_type(size_t n) {
    H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t, std::max<size_t>(n, 1));
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    H5Tset_cset(t, H5T_CSET_UTF8);
    return t;
  }
  void attr(hid_t obj, const char* name, hid_t type, const void* v) {
    H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
    H5Id a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a.ok() || H5Awrite(a, type, v) < 0) fail(std::string("cannot write attribute ") + name + " in");
  }
  void attr_i64(hid_t o, const char* n, int64_t v) { attr(o, n, H5T_STD_I64LE, &v); }
  void attr_f64(hid_t o, const char* n, double v) { attr(o, n, H5T_IEEE_F64LE, &v); }
  void attr_u32(hid_t o, const char* n, uint32_t v) { attr(o, n, H5T_STD_U32LE, &v); }
  void attr_str(hid_t o, const char* n, const std::string& v) {
    std::string s = v.empty() ? std::string(1, '\0') : v;
    H5Id t = str_type(s.size());
    attr(o, n, t, s.data());
  }

  std::string path_;
  bool write_small_ = true;
  H5Id file_, gcpl_, dcpl_;
  int64_t tensor_bytes_ = 0;
  std::vector<uint16_t> scratch_;
  std::vector<char> zeros_;
};

// ---------------------------------------------------------------------------------------
// Reading. Every problem is a UserError located at the file.
[[noreturn]] void bad(const std::string& path, const std::string& what, const std::string& fix = "") {
  throw UserError(SourceLoc{path, 0, 0}, what, fix);
}

const char* kCorruptFix = "the file is damaged or was not written by runner; use an older checkpoint or start over";

struct DsInfo {
  std::string path;                // "/params/h.0.attn.qkv.weight"
  std::vector<int64_t> shape;
  std::string dtype;               // the dtype attribute, or a description of the HDF5 type
  std::string type_desc;           // "float32", "uint64", "str[79]"
  hsize_t type_size = 0;
  bool contiguous = false;
  haddr_t offset = HADDR_UNDEF;
  hsize_t storage = 0;
  std::optional<uint32_t> crc;
  std::string problem;             // non-empty: this dataset cannot be verified (why)
  uint64_t expected_bytes() const {
    uint64_t n = type_size;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

class FileReader {
 public:
  explicit FileReader(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    auto st = fs::status(path_, ec);
    if (ec || !fs::exists(st)) bad(path_, "checkpoint file does not exist");
    if (!fs::is_regular_file(st)) bad(path_, "checkpoint is not a regular file");
    fd_.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_.fd < 0) bad(path_, std::string("cannot open checkpoint: ") + std::strerror(errno));
    struct stat sb;
    if (::fstat(fd_.fd, &sb) != 0) bad(path_, std::string("cannot stat checkpoint: ") + std::strerror(errno));
    file_size_ = static_cast<uint64_t>(sb.st_size);
    if (file_size_ == 0) bad(path_, "checkpoint file is empty (0 bytes)", kCorruptFix);
    H5Lock l;
    htri_t is = H5Fis_hdf5(path_.c_str());
    if (is <= 0) {
      H5Eclear2(H5E_DEFAULT);
      bad(path_, fmt::format("not an HDF5 file (no HDF5 signature in its {} bytes)", file_size_), kCorruptFix);
    }
    H5Id fapl = FileWriter::make_fapl();
    file_ = H5Id(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
    if (!file_.ok()) {
      std::string detail = h5_error_text();
      if (detail.find("truncated") != std::string::npos)
        bad(path_, fmt::format("checkpoint is truncated ({} bytes on disk; HDF5: {})", file_size_, detail), kCorruptFix);
      bad(path_, "cannot be opened as HDF5 (" + detail + ")", kCorruptFix);
    }
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }

  // Whether every component of an absolute path exists as a link.
  bool exists(const std::string& p) const {
    H5Lock l;
    size_t pos = 0;
    bool e = true;
    while (e && (pos = p.find('/', pos + 1)) != std::string::npos)
      e = H5Lexists(file_, p.substr(0, pos).c_str(), H5P_DEFAULT) > 0;
    e = e && H5Lexists(file_, p.c_str(), H5P_DEFAULT) > 0;
    H5Eclear2(H5E_DEFAULT);
    return e;
  }

  StateScalars state() const {
    H5Lock l;
    if (!exists("/state")) bad(path_, "group /state is missing: not a runner checkpoint", kCorruptFix);
    H5Id g(H5Oopen(file_, "/state", H5P_DEFAULT), H5Oclose);
    if (!g.ok() || H5Iget_type(g) != H5I_GROUP) bad(path_, "/state is not a group (" + h5_error_text() + ")", kCorruptFix);
    StateScalars s;
    s.format_version = attr_i64(g, "/state", "format_version");
    if (s.format_version > kCheckpointFormatVersion)
      bad(path_, fmt::format("checkpoint format {} is newer than this runner's ({})", s.format_version, kCheckpointFormatVersion),
          "resume with the runner version that wrote it (see /state program_version), or a newer one");
    if (s.format_version < 1) bad(path_, fmt::format("/state format_version {} is invalid", s.format_version), kCorruptFix);
    s.program_version = attr_str(g, "/state", "program_version");
    s.step = attr_i64(g, "/state", "step");
    s.tokens = attr_i64(g, "/state", "tokens");
    s.loss_ema = attr_f64(g, "/state", "loss_ema");
    s.scale = attr_f64(g, "/state", "loss_scale");
    s.good_steps = attr_i64(g, "/state", "good_steps");
    s.skipped_steps = attr_i64(g, "/state", "skipped_steps");
    s.world_size = attr_i64(g, "/state", "world_size");
    uint32_t stored = static_cast<uint32_t>(attr_i64(g, "/state", "crc32c"));
    uint32_t computed = state_crc(s);
    if (stored != computed)
      bad(path_, fmt::format("/state attributes fail their checksum (stored crc32c {:#010x}, computed {:#010x})", stored, computed),
          kCorruptFix);
    if (s.step < 0 || s.tokens < 0 || s.world_size < 1)
      bad(path_, fmt::format("/state holds step {}, tokens {}, world_size {}", s.step, s.tokens, s.world_size), kCorruptFix);
    return s;
  }

  // Metadata of one dataset; throws when it is missing or not a dataset. Never reads data.
  DsInfo info(const std::string& p) const {
    H5Lock l;
    if (!exists(p)) bad(path_, "dataset " + p + " is missing", kCorruptFix);
    H5Id o(H5Oopen(file_, p.c_str(), H5P_DEFAULT), H5Oclose);
    if (!o.ok()) bad(path_, "dataset " + p + " cannot be opened (" + h5_error_text() + ")", kCorruptFix);
    if (H5Iget_type(o) != H5I_DATASET) bad(path_, p + " is not a dataset", kCorruptFix);
    return describe(o, p);
  }

  // Every dataset reachable by hard links, in creation order where the file tracks it.
  std::vector<std::string> list_datasets() const {
    H5Lock l;
    struct Ctx {
      std::vector<std::string> out;
    } ctx;
    auto cb = [](hid_t g, const char* name, const H5L_info_t* li, void* op) -> herr_t {
      auto* c = static_cast<Ctx*>(op);
      if (li->type != H5L_TYPE_HARD) return 0;
      hid_t o = H5Oopen(g, name, H5P_DEFAULT);
      if (o < 0) {
        H5Eclear2(H5E_DEFAULT);
        c->out.push_back(std::string("/") + name);  // reported as unreadable by info()
        return 0;
      }
      if (H5Iget_type(o) == H5I_DATASET) c->out.push_back(std::string("/") + name);
      H5Oclose(o);
      return 0;
    };
    if (H5Lvisit(file_, H5_INDEX_CRT_ORDER, H5_ITER_INC, cb, &ctx) < 0) {
      H5Eclear2(H5E_DEFAULT);
      ctx.out.clear();
      if (H5Lvisit(file_, H5_INDEX_NAME, H5_ITER_INC, cb, &ctx) < 0)
        bad(path_, "cannot list the file's datasets (" + h5_error_text() + ")", kCorruptFix);
    }
    return ctx.out;
  }

  // Names of the links directly in a group ([] when the group is missing).
  std::vector<std::string> members(const std::string& group) const {
    H5Lock l;
    std::vector<std::string> out;
    if (!exists(group)) return out;
    auto cb = [](hid_t, const char* name, const H5L_info_t*, void* op) -> herr_t {
      static_cast<std::vector<std::string>*>(op)->push_back(name);
      return 0;
    };
    hsize_t idx = 0;
    if (H5Literate_by_name(file_, group.c_str(), H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &out, H5P_DEFAULT) < 0)
      bad(path_, "cannot list group " + group + " (" + h5_error_text() + ")", kCorruptFix);
    return out;
  }

  // Checks a dataset against what the state expects: type (exactly), shape, storage. Throws.
  void expect(const DsInfo& d, const std::vector<int64_t>& shape, ops::DType stored, const char* role) const {
    if (d.dtype != ops::dtype_name(stored))
      bad(path_, fmt::format("dataset {} holds {} but {} ({}) is expected", d.path, d.dtype, ops::dtype_name(stored), role),
          kCorruptFix);
    {
      H5Lock l;
      H5Id ds(H5Dopen2(file_, d.path.c_str(), H5P_DEFAULT), H5Dclose);
      H5Id t(H5Dget_type(ds), H5Tclose);
      if (!t.ok() || H5Tequal(t, h5_type(stored)) <= 0)
        bad(path_, fmt::format("dataset {} is stored as {} but {} needs {}", d.path, d.type_desc, ops::dtype_name(stored),
                               describe_h5_type(h5_type(stored))),
            kCorruptFix);
    }
    if (d.shape != shape)
      bad(path_, fmt::format("dataset {} has shape {} but the model expects {}", d.path, ops::shape_to_string(d.shape),
                             ops::shape_to_string(shape)),
          "the recipe's model differs from the one that wrote this checkpoint; resume with the stored recipe "
          "(runner resume RUN_DIR) or start a new run directory");
    check_storage(d);
  }

  // Throws unless the dataset's bytes can be read: contiguous, storage = shape x type size,
  // inside the file, checksum present.
  void check_storage(const DsInfo& d) const {
    if (!d.problem.empty()) bad(path_, "dataset " + d.path + " " + d.problem, kCorruptFix);
  }

  // Reads the dataset's stored bytes in pieces, calling fn(bytes, offset, n) for each, and
  // verifies the checksum. `dst` (optional) receives the bytes directly instead of a buffer.
  template <class Fn>
  void read(const DsInfo& d, void* dst, Fn&& fn) const {
    check_storage(d);
    uint64_t total = d.expected_bytes(), done = 0;
    std::vector<char> buf;
    if (!dst) buf.resize(std::min<uint64_t>(total, kReadChunkBytes));
    uint32_t crc = 0;
    while (done < total) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(total - done, kReadChunkBytes));
      char* p = dst ? static_cast<char*>(dst) + done : buf.data();
      size_t got = 0;
      while (got < n) {
        ssize_t r = ::pread(fd_.fd, p + got, n - got, static_cast<off_t>(d.offset + done + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) bad(path_, fmt::format("cannot read dataset {}: {}", d.path, std::strerror(errno)));
        if (r == 0) bad(path_, fmt::format("dataset {} ends past the end of the file (truncated)", d.path), kCorruptFix);
        got += static_cast<size_t>(r);
      }
      crc = crc32c(crc, p, n);
      fn(p, done, n);
      done += n;
    }
    if (crc != *d.crc)
      bad(path_, fmt::format("dataset {} fails its checksum (stored crc32c {:#010x}, computed {:#010x})", d.path, *d.crc, crc),
          kCorruptFix);
  }

  // Small datasets: read whole (size already checked against expectations by the caller).
  std::vector<char> read_small(const DsInfo& d) const {
    std::vector<char> out(d.expected_bytes());
    read(d, out.data(), [](const char*, uint64_t, size_t) {});
    return out;
  }

  std::vector<uint64_t> u64_array(const std::string& p, size_t n) const {
    DsInfo d = info(p);
    {
      H5Lock l;
      H5Id ds(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose);
      H5Id t(H5Dget_type(ds), H5Tclose);
      if (H5Tequal(t, H5T_STD_U64LE) <= 0)
        bad(path_, fmt::format("dataset {} is stored as {} but uint64 is expected", p, d.type_desc), kCorruptFix);
    }
    if (d.shape != std::vector<int64_t>{static_cast<int64_t>(n)})
      bad(path_, fmt::format("dataset {} has shape {} but ({}) is expected", p, ops::shape_to_string(d.shape), n), kCorruptFix);
    std::vector<char> raw = read_small(d);
    std::vector<uint64_t> v(n);
    std::memcpy(v.data(), raw.data(), n * 8);
    return v;
  }

  std::string text(const std::string& p) const {
    DsInfo d = info(p);
    {
      H5Lock l;
      H5Id ds(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose);
      H5Id t(H5Dget_type(ds), H5Tclose);
      if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0 || !d.shape.empty())
        bad(path_, fmt::format("dataset {} is a {} of shape {} but a fixed-length string scalar is expected", p, d.type_desc,
                               ops::shape_to_string(d.shape)),
            kCorruptFix);
    }
    if (d.type_size > kMaxRecipeBytes) bad(path_, fmt::format("dataset {} claims {} bytes", p, d.type_size), kCorruptFix);
    std::vector<char> raw = read_small(d);
    std::string s(raw.begin(), raw.end());
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }

 private:
  DsInfo describe(hid_t ds, const std::string& p) const {  // lock held
    DsInfo d;
    d.path = p;
    H5Id space(H5Dget_space(ds), H5Sclose);
    H5Id type(H5Dget_type(ds), H5Tclose);
    H5Id dcpl(H5Dget_create_plist(ds), H5Pclose);
    if (!space.ok() || !type.ok() || !dcpl.ok()) {
      d.problem = "has unreadable metadata (" + h5_error_text() + ")";
      return d;
    }
    H5S_class_t sc = H5Sget_simple_extent_type(space);
    if (sc == H5S_SIMPLE) {
      int nd = H5Sget_simple_extent_ndims(space);
      if (nd < 0 || nd > 32) {
        d.problem = "has an invalid rank";
        return d;
      }
      std::vector<hsize_t> dims(nd);
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      for (auto x : dims) d.shape.push_back(static_cast<int64_t>(x));
    } else if (sc != H5S_SCALAR) {
      d.problem = "has no data space (null)";
      return d;
    }
    d.type_size = H5Tget_size(type);
    d.type_desc = describe_h5_type(type);
    d.dtype = d.type_desc;
    if (H5Aexists(ds, "dtype") > 0) {
      std::string s = attr_str(ds, p, "dtype");
      if (!s.empty()) d.dtype = s;
    }
    H5Eclear2(H5E_DEFAULT);
    if (H5Aexists(ds, "crc32c") > 0) d.crc = static_cast<uint32_t>(attr_i64(ds, p, "crc32c"));
    H5Eclear2(H5E_DEFAULT);
    d.contiguous = H5Pget_layout(dcpl) == H5D_CONTIGUOUS;
    d.offset = H5Dget_offset(ds);
    d.storage = H5Dget_storage_size(ds);
    H5Eclear2(H5E_DEFAULT);
    // Overflow-safe expected size.
    uint64_t expect = d.type_size;
    bool overflow = false;
    for (auto x : d.shape) {
      if (x != 0 && expect > UINT64_MAX / static_cast<uint64_t>(x)) overflow = true;
      expect *= static_cast<uint64_t>(x);
    }
    if (H5Tget_class(type) == H5T_VLEN || H5Tis_variable_str(type) > 0)
      d.problem = "holds variable-length data (runner writes fixed-size types only)";
    else if (overflow)
      d.problem = "claims a size that overflows 64 bits";
    else if (!d.contiguous)
      d.problem = "is not stored contiguously (chunked, compressed or compact; runner writes contiguous datasets)";
    else if (expect > 0 && (d.offset == HADDR_UNDEF || d.storage == 0))
      d.problem = fmt::format("holds no data (shape {} x {} bytes needs {} bytes)", ops::shape_to_string(d.shape), d.type_size, expect);
    else if (d.storage != expect)
      d.problem = fmt::format("stores {} bytes but shape {} x {} bytes needs {}", d.storage, ops::shape_to_string(d.shape),
                              d.type_size, expect);
    else if (expect > 0 && (d.offset > file_size_ || expect > file_size_ - d.offset))
      d.problem = fmt::format("ends at byte {} past the end of the file ({} bytes): truncated", d.offset + expect, file_size_);
    else if (!d.crc)
      d.problem = "has no crc32c attribute";
    return d;
  }

  // Attributes: exist, scalar, of the right class; converted to the native type by HDF5.
  H5Id open_attr(hid_t obj, const std::string& where, const char* name, H5T_class_t cls) const {
    if (H5Aexists(obj, name) <= 0) bad(path_, fmt::format("attribute {} of {} is missing", name, where), kCorruptFix);
    H5Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    H5Id t(H5Aget_type(a), H5Tclose);
    H5Id s(H5Aget_space(a), H5Sclose);
    if (!a.ok() || !t.ok() || !s.ok() || H5Tget_class(t) != cls || H5Sget_simple_extent_npoints(s) != 1)
      bad(path_, fmt::format("attribute {} of {} has the wrong type or size", name, where), kCorruptFix);
    return a;
  }
  int64_t attr_i64(hid_t obj, const std::string& where, const char* name) const {
    H5Id a = open_attr(obj, where, name, H5T_INTEGER);
    int64_t v = 0;
    if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
    return v;
  }
  double attr_f64(hid_t obj, const std::string& where, const char* name) const {
    H5Id a = open_attr(obj, where, name, H5T_FLOAT);
    double v = 0;
    if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
    return v;
  }
  std::string attr_str(hid_t obj, const std::string& where, const char* name) const {
    H5Id a = open_attr(obj, where, name, H5T_STRING);
    H5Id t(H5Aget_type(a), H5Tclose);
    size_t n = H5Tget_size(t);
    if (H5Tis_variable_str(t) > 0 || n == 0 || n > kMaxStringAttrBytes)
      bad(path_, fmt::format("attribute {} of {} is not a fixed-length string", name, where), kCorruptFix);
    std::string s(n, '\0');
    if (H5Aread(a, t, s.data()) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }

  struct Fd {  // closes itself, also when the constructor throws
    int fd = -1;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  };
  std::string path_;
  Fd fd_;
  uint64_t file_size_ = 0;
  H5Id file_;
};

// ---------------------------------------------------------------------------------------
// Directory operations.
void fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(sys_error("cannot open for fsync", p));
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw std::runtime_error(sys_error("cannot fsync", p));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) throw std::runtime_error(sys_error("cannot rename " + from + " to", to));
}

// LATEST := name + "\n", by the same temporary/fsync/rename protocol.
void write_latest(const std::string& dir, const std::string& name) {
  std::string tmp = (fs::path(dir) / fmt::format(".LATEST.tmp.{}", ::getpid())).string();
  std::string final_path = (fs::path(dir) / "LATEST").string();
  try {
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(sys_error("cannot create", tmp));
    std::string text = name + "\n";
    ssize_t w = ::write(fd, text.data(), text.size());
    int rc = (w == static_cast<ssize_t>(text.size())) ? ::fsync(fd) : -1;
    int saved = errno;
    ::close(fd);
    errno = saved;
    if (rc != 0) throw std::runtime_error(sys_error("cannot write", tmp));
    fault_check_stage(WriteFault::BeforeLatestRename);
    rename_or_throw(tmp, final_path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_path(dir, true);
}

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

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API.

void set_write_fault_after_bytes(int64_t n) { g_fault_bytes.store(n < 0 ? -1 : n); }
void set_write_fault_at(WriteFault where) { g_fault_stage.store(static_cast<int>(where)); }

std::string checkpoint_file_name(int64_t step) { return fmt::format("step_{:08d}.h5", step); }

bool parse_checkpoint_file_name(const std::string& name, int64_t* step) {
  if (name.size() < 9 || name.rfind("step_", 0) != 0 || name.substr(name.size() - 3) != ".h5") return false;
  std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  if (step) *step = std::stoll(digits);
  return true;
}

std::vector<int64_t> list_checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    int64_t s;
    if (e.is_regular_file(ec) && parse_checkpoint_file_name(e.path().filename().string(), &s)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string read_latest(const std::string& dir) {
  std::FILE* f = std::fopen((fs::path(dir) / "LATEST").c_str(), "rb");
  if (!f) return "";
  char buf[256];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return parse_checkpoint_file_name(s, nullptr) ? s : "";
}

int cleanup_stale(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  const std::string own = fmt::format(".tmp.{}", ::getpid());
  int removed = 0;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.size() < 2 || n[0] != '.' || n.find(".tmp.") == std::string::npos || !e.is_regular_file(ec)) continue;
    if (n.size() >= own.size() && n.compare(n.size() - own.size(), own.size(), own) == 0) continue;  // ours, in flight
    if (fs::remove(e.path(), ec)) ++removed;
  }
  if (removed) fsync_path(dir, true);
  return removed;
}

int64_t write_checkpoint_file(const std::string& path, const TrainState& s, const WriteOptions& opt) {
  const ParamSet& ps = s.params;
  RUNNER_CHECK(ps.names.size() == ps.values.size(), "ParamSet names and values differ in length");
  const bool have_moments = !s.adam_m.empty();
  RUNNER_CHECK(!have_moments || (s.adam_m.size() == ps.values.size() && s.adam_v.size() == ps.values.size()),
               "adam moments must mirror the parameters");
  FileWriter w(path);
  StateScalars sc;
  sc.format_version = kCheckpointFormatVersion;
  sc.program_version = RUNNER_VERSION;
  sc.step = s.step;
  sc.tokens = s.tokens;
  sc.loss_ema = s.loss_ema;
  sc.scale = s.scaler.scale;
  sc.good_steps = s.scaler.good_steps;
  sc.skipped_steps = s.scaler.skipped_steps;
  sc.world_size = s.world_size;
  w.state(sc);
  w.text("/recipe", s.recipe_yaml);
  // One entry per rank of the writing job. The runner's RNGs are counter-based and its data
  // cursor global, so every rank's entry holds the same values today; the per-rank places are
  // the format's room for per-rank generators.
  w.group("/rng");
  for (int r = 0; r < std::max(1, s.world_size); ++r)
    w.u64_array(fmt::format("/rng/rank_{}", r),
                {s.rng.init_seed, s.rng.dropout_seed, s.rng.data_seed, s.rng.sample_seed, s.rng.sample_counter}, kRngFields);
  w.group("/data");
  for (int r = 0; r < std::max(1, s.world_size); ++r)
    w.u64_array(fmt::format("/data/rank_{}", r), {static_cast<uint64_t>(s.loader.sample_cursor), s.loader.seed},
                kDataFields);
  w.group("/params");
  for (size_t i = 0; i < ps.names.size(); ++i) {
    RUNNER_CHECK(valid_name(ps.names[i]), "parameter name '" + ps.names[i] + "' cannot be an HDF5 dataset name");
    const ops::Tensor& t = ps.values[i];
    w.tensor("/params/" + ps.names[i], t.shape(), t.dtype(), t.raw(), t.dtype());
  }
  w.group("/optimizer");
  const ops::DType mdt = opt.optimizer_bf16 ? ops::DType::BF16 : ops::DType::F32;
  for (int which = 0; which < 2; ++which) {
    const char* g = which == 0 ? "/optimizer/adam_m" : "/optimizer/adam_v";
    const auto& moments = which == 0 ? s.adam_m : s.adam_v;
    w.group(g);
    for (size_t i = 0; i < ps.names.size(); ++i) {
      const ops::Tensor& p = ps.values[i];
      if (have_moments) {
        const ops::Tensor& m = moments[i];
        RUNNER_CHECK(m.shape() == p.shape() && m.dtype() == ops::DType::F32, "moment of " + ps.names[i] + " must be fp32 " + p.shape_str());
        w.tensor(std::string(g) + "/" + ps.names[i], m.shape(), ops::DType::F32, m.raw(), mdt);
      } else {
        w.tensor(std::string(g) + "/" + ps.names[i], p.shape(), ops::DType::F32, nullptr, mdt);  // zeros
      }
    }
  }
  w.close();
  return w.tensor_bytes();
}

// The end of the atomic protocol, shared by the serial and the collective writer: verify the
// finished temporary, make it durable, rename it to dir/name, make the rename durable, then
// (latest) point LATEST at it. *renamed says whether the rename happened before a throw.
static void publish(const std::string& tmp, const std::string& dir, const std::string& name, bool latest, bool* renamed) {
  try {
    verify_checkpoint_file(tmp);
  } catch (const UserError& e) {
    throw std::runtime_error(std::string("checkpoint: the file just written does not verify: ") + e.what());
  }
  fsync_path(tmp, false);
  fault_check_stage(WriteFault::BeforeRename);
  rename_or_throw(tmp, (fs::path(dir) / name).string());
  *renamed = true;
  fsync_path(dir, true);
  if (latest) {
    fault_check_stage(WriteFault::BeforeLatest);
    write_latest(dir, name);
  }
}

SaveResult write_checkpoint_atomic(const std::string& dir, const TrainState& s, const WriteOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("checkpoint: cannot create directory " + dir + ": " + ec.message());
  const std::string name = checkpoint_file_name(s.step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = (fs::path(dir) / fmt::format(".{}.tmp.{}", name, ::getpid())).string();
  ::unlink(tmp.c_str());  // a leftover of an earlier failed attempt by this process
  SaveResult r;
  r.path = final_path;
  r.step = s.step;
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

// ---------------------------------------------------------------------------------------
// Collective writing (see checkpoint.h). Every rank runs the same sequence of phases; a phase
// that fails on any rank is agreed on at its end (Agreement::settle), so that no rank is left
// waiting in a collective and nothing is published.
namespace {

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

// /state scalars and the recipe, as rank 0 holds them.
struct CollectiveHeader {
  int64_t step, tokens, good_steps, skipped_steps, recipe_bytes;
  double loss_ema, scale;
};

constexpr int kRankEntries = 7;  // 5 RNG words + 2 data-cursor words per rank

// Bytes of logical rows per collective write round (kSlabBytes; tests lower it to exercise
// tensors written in many rounds).
std::atomic<size_t> g_round_bytes{kSlabBytes};

std::string dataset_path(int which, const std::string& name) {
  return (which == 0 ? "/params/" : which == 1 ? "/optimizer/adam_m/" : "/optimizer/adam_v/") + name;
}

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
  const int rank = comm.rank(), size = comm.size();
  void* mpi_comm = parallel::mpi_handle(comm);
  RUNNER_CHECK(mpi_comm || size == 1, "write_checkpoint_collective: a multi-rank communicator must be an MPI one");
  const size_t n = tensors.size();
  for (auto& t : tensors) {
    RUNNER_CHECK(valid_name(t.name), "parameter name '" + t.name + "' cannot be an HDF5 dataset name");
    RUNNER_CHECK(!t.shape.empty(), "checkpoint tensor " + t.name + " has no dimensions");
    for (auto d : t.shape) RUNNER_CHECK(d >= 0, "checkpoint tensor " + t.name + " has a negative dimension");
  }
  const ops::DType mdt = opt.optimizer_bf16 ? ops::DType::BF16 : ops::DType::F32;
  auto stored_of = [&](int which) { return which == 0 ? ops::DType::F32 : mdt; };

  Agreement err;
  // 0. Rank 0's scalars and recipe (the step names the file).
  CollectiveHeader h{s.step, s.tokens, s.scaler.good_steps, s.scaler.skipped_steps,
                     static_cast<int64_t>(s.recipe_yaml.size()), s.loss_ema, s.scaler.scale};
  comm.broadcast(&h, sizeof h, 0);
  std::string recipe = rank == 0 ? s.recipe_yaml : std::string(static_cast<size_t>(h.recipe_bytes), '\0');
  comm.broadcast(recipe.data(), recipe.size(), 0);
  // 1. Rank 0 prepares the directory; the temporary's name is rank 0's (its pid).
  const std::string name = checkpoint_file_name(h.step);
  const std::string final_path = (fs::path(dir) / name).string();
  int64_t pid = rank == 0 ? static_cast<int64_t>(::getpid()) : 0;
  comm.allreduce_sum(&pid, 1);
  const std::string tmp = (fs::path(dir) / fmt::format(".{}.tmp.{}", name, pid)).string();
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw std::runtime_error("checkpoint: cannot create directory " + dir + ": " + ec.message());
      ::unlink(tmp.c_str());  // a leftover of an earlier failed attempt by this process
    } catch (...) {
      err.capture();
    }
  }
  err.settle(comm);

  // 2. Every rank's RNG words and data cursor.
  std::vector<int64_t> table(static_cast<size_t>(size) * kRankEntries, 0);
  {
    const uint64_t mine[kRankEntries] = {s.rng.init_seed, s.rng.dropout_seed, s.rng.data_seed, s.rng.sample_seed,
                                         s.rng.sample_counter, static_cast<uint64_t>(s.loader.sample_cursor), s.loader.seed};
    std::memcpy(&table[static_cast<size_t>(rank) * kRankEntries], mine, sizeof mine);
    comm.allreduce_sum(table.data(), static_cast<int64_t>(table.size()));  // one nonzero term each: exact
  }
  auto word = [&](int r, int k) {
    uint64_t v;
    std::memcpy(&v, &table[static_cast<size_t>(r) * kRankEntries + static_cast<size_t>(k)], 8);
    return v;
  };

  SaveResult res;
  res.path = final_path;
  res.step = h.step;
  for (int which = 0; which < 3; ++which)
    for (auto& t : tensors)
      res.tensor_bytes += ops::numel_of(t.shape) * static_cast<int64_t>(ops::dtype_size(stored_of(which)));
  bool renamed = false;
  try {
    {
      // 3. Structure, collectively, in the serial writer's order.
      std::unique_ptr<FileWriter> w;
      std::vector<H5Id> ds;  // declared after w: closed before the file
      try {
        w = std::make_unique<FileWriter>(tmp, mpi_comm, rank == 0);
      } catch (...) {
        err.capture();
      }
      err.settle(comm);
      try {
        StateScalars sc;
        sc.format_version = kCheckpointFormatVersion;
        sc.program_version = RUNNER_VERSION;
        sc.step = h.step;
        sc.tokens = h.tokens;
        sc.loss_ema = h.loss_ema;
        sc.scale = h.scale;
        sc.good_steps = h.good_steps;
        sc.skipped_steps = h.skipped_steps;
        sc.world_size = size;
        w->state(sc);
        w->text("/recipe", recipe);
        w->group("/rng");
        for (int r = 0; r < size; ++r)
          w->u64_array(fmt::format("/rng/rank_{}", r), {word(r, 0), word(r, 1), word(r, 2), word(r, 3), word(r, 4)}, kRngFields);
        w->group("/data");
        for (int r = 0; r < size; ++r) w->u64_array(fmt::format("/data/rank_{}", r), {word(r, 5), word(r, 6)}, kDataFields);
        w->group("/params");
        for (auto& t : tensors) ds.push_back(w->create_tensor("/params/" + t.name, t.shape, stored_of(0)));
        w->group("/optimizer");
        for (int which = 1; which <= 2; ++which) {
          const std::string g = which == 1 ? "/optimizer/adam_m" : "/optimizer/adam_v";
          w->group(g);
          for (auto& t : tensors) ds.push_back(w->create_tensor(g + "/" + t.name, t.shape, stored_of(which)));
        }
      } catch (...) {
        err.capture();
      }
      err.settle(comm);

      // 4. Data: each dataset in rounds of at most kSlabBytes of logical rows; every rank takes
      //    part in every round's collective H5Dwrite, selecting its part of those rows or nothing.
      H5Id dxpl;
      {
        H5Lock l;
        dxpl = H5Id(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
        if (mpi_comm) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
#endif
      }
      int64_t written = 0;
      std::vector<char> pack;
      for (int which = 0; which < 3; ++which) {
        const ops::DType st = stored_of(which);
        const size_t esize = ops::dtype_size(st);
        for (size_t i = 0; i < n; ++i) {
          const CollectiveTensor& t = tensors[i];
          hid_t d = ds[static_cast<size_t>(which) * n + i];
          const int nd = static_cast<int>(t.shape.size());
          const int64_t rows = t.shape[0], numel = ops::numel_of(t.shape);
          const int64_t row_elems = rows ? numel / rows : 0;
          TensorSlice sl;
          try {
            sl = slice(which, i);  // always called: it may run collectives of its own
            if (!sl.runs.empty() && !err.failed) {
              int64_t sel = 1;
              for (int k = 1; k < nd; ++k) sel *= k == sl.split_dim ? sl.count * sl.block : t.shape[static_cast<size_t>(k)];
              bool ok = sel == sl.src_row_elems && (sl.split_dim == -1 || (sl.split_dim >= 1 && sl.split_dim < nd));
              if (ok && sl.split_dim >= 1) {
                const int64_t dim = t.shape[static_cast<size_t>(sl.split_dim)];
                ok = sl.start >= 0 && sl.count >= 1 && sl.block >= 1 && sl.stride >= 1 &&
                     (sl.count == 1 || sl.stride >= sl.block) && sl.start + (sl.count - 1) * sl.stride + sl.block <= dim;
              }
              int64_t prev_end = 0;
              for (auto& r : sl.runs) {
                ok = ok && r.rows >= 0 && r.src_row >= 0 && r.dst_row >= prev_end && r.dst_row + r.rows <= rows;
                prev_end = r.dst_row + r.rows;
              }
              RUNNER_CHECK(ok, "checkpoint: the slice of " + t.name + " this rank writes does not fit its logical shape " +
                                   ops::shape_to_string(t.shape));
            }
          } catch (...) {
            err.capture();
          }
          if (err.failed) sl.runs.clear();  // a failed rank keeps taking part, writing nothing
          H5Id filespace;
          {
            H5Lock l;
            filespace = H5Id(H5Dget_space(d), H5Sclose);
          }
          const size_t round_bytes = g_round_bytes.load();
          const int64_t per_round = row_elems ? std::max<int64_t>(1, static_cast<int64_t>(round_bytes / (row_elems * esize))) : 1;
          for (int64_t r0 = 0; numel > 0 && r0 < rows; r0 += per_round) {
            const int64_t r1 = std::min(rows, r0 + per_round);
            std::vector<SliceRun> pieces;  // this round's part of the runs
            for (auto& r : sl.runs) {
              int64_t a = std::max(r0, r.dst_row), b = std::min(r1, r.dst_row + r.rows);
              if (a < b) pieces.push_back({r.src_row + (a - r.dst_row), a, b - a});
            }
            try {
              if (!pieces.empty()) fault_check_bytes(written);
            } catch (...) {
              err.capture();
              pieces.clear();
            }
            int64_t elems = 0;
            for (auto& p : pieces) elems += p.rows * sl.src_row_elems;
            static const char kNothing = 0;
            const void* buf = &kNothing;
            if (elems > 0) {
              if (pieces.size() == 1 && sl.src && st == ops::DType::F32) {
                buf = sl.src + pieces[0].src_row * sl.src_row_elems;
              } else {
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
                buf = pack.data();
              }
            }
            try {
              H5Lock l;
              H5Sselect_none(filespace);
              for (size_t p = 0; p < pieces.size(); ++p) {
                std::vector<hsize_t> start(static_cast<size_t>(nd)), stride(static_cast<size_t>(nd), 1),
                    count(static_cast<size_t>(nd), 1), block(static_cast<size_t>(nd));
                start[0] = static_cast<hsize_t>(pieces[p].dst_row);
                block[0] = static_cast<hsize_t>(pieces[p].rows);
                for (int k = 1; k < nd; ++k) {
                  const size_t kk = static_cast<size_t>(k);
                  if (k == sl.split_dim) {
                    start[kk] = static_cast<hsize_t>(sl.start);
                    stride[kk] = static_cast<hsize_t>(std::max<int64_t>(sl.stride, 1));
                    count[kk] = static_cast<hsize_t>(sl.count);
                    block[kk] = static_cast<hsize_t>(sl.block);
                  } else {
                    start[kk] = 0;
                    block[kk] = static_cast<hsize_t>(t.shape[kk]);
                  }
                }
                if (H5Sselect_hyperslab(filespace, p == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), stride.data(),
                                        count.data(), block.data()) < 0)
                  w->fail("cannot select this rank's slice of dataset " + dataset_path(which, t.name) + " in");
              }
              hsize_t mdim = static_cast<hsize_t>(std::max<int64_t>(elems, 1));
              H5Id mem(H5Screate_simple(1, &mdim, nullptr), H5Sclose);
              if (elems == 0) H5Sselect_none(mem);
              if (H5Dwrite(d, h5_type(st), mem, filespace, dxpl, buf) < 0)
                w->fail("cannot write dataset " + dataset_path(which, t.name) + " in");
            } catch (...) {
              err.capture();
            }
            written += elems * static_cast<int64_t>(esize);
            try {
              if (elems > 0) fault_check_bytes(written);
            } catch (...) {
              err.capture();
            }
          }
        }
      }
      // Every rank's bytes on disk before anyone reads them back.
      try {
        H5Lock l;
        if (H5Fflush(w->file(), H5F_SCOPE_GLOBAL) < 0) w->fail("cannot flush");
      } catch (...) {
        err.capture();
      }
      err.settle(comm);  // an all-reduce: every rank has flushed once it returns

      // 5. Checksums of the tensor datasets' stored bytes, read back (dataset k by rank k % size).
      std::vector<int64_t> crcs(ds.size(), 0);
      try {
        std::vector<haddr_t> offsets(ds.size(), HADDR_UNDEF);
        {
          H5Lock l;
          for (size_t k = 0; k < ds.size(); ++k) offsets[k] = H5Dget_offset(ds[k]);
          H5Eclear2(H5E_DEFAULT);
        }
        int fd = -1;
        std::vector<char> buf;
        for (size_t k = static_cast<size_t>(rank); k < ds.size(); k += static_cast<size_t>(size)) {
          const CollectiveTensor& t = tensors[k % n];
          const uint64_t bytes = static_cast<uint64_t>(ops::numel_of(t.shape)) * ops::dtype_size(stored_of(static_cast<int>(k / n)));
          if (bytes == 0) continue;
          const std::string p = dataset_path(static_cast<int>(k / n), t.name);
          if (offsets[k] == HADDR_UNDEF) throw std::runtime_error("checkpoint: dataset " + p + " has no storage in " + tmp);
          if (fd < 0) {
            fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) throw std::runtime_error(sys_error("cannot open for reading", tmp));
          }
          buf.resize(static_cast<size_t>(std::min<uint64_t>(bytes, kReadChunkBytes)));
          uint32_t crc = 0;
          bool ok = true;
          for (uint64_t done = 0; ok && done < bytes;) {
            size_t want = static_cast<size_t>(std::min<uint64_t>(bytes - done, kReadChunkBytes));
            ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(offsets[k] + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
              ok = false;
              break;
            }
            crc = crc32c(crc, buf.data(), static_cast<size_t>(r));
            done += static_cast<uint64_t>(r);
          }
          if (!ok) {
            std::string e = sys_error("cannot read back dataset " + p + " of", tmp);
            ::close(fd);
            throw std::runtime_error(e);
          }
          crcs[k] = crc;
        }
        if (fd >= 0) ::close(fd);
      } catch (...) {
        err.capture();
      }
      comm.allreduce_sum(crcs.data(), static_cast<int64_t>(crcs.size()));  // one nonzero term each
      err.settle(comm);

      // 6. Identical attributes on every rank, then a collective close.
      try {
        for (size_t k = 0; k < ds.size(); ++k) {
          w->attr_crc(ds[k], static_cast<uint32_t>(crcs[k]));
          if (!ds[k].close()) {
            H5Lock l;
            w->fail("cannot close dataset " + dataset_path(static_cast<int>(k / n), tensors[k % n].name) + " in");
          }
        }
        ds.clear();
        w->close();
      } catch (...) {
        err.capture();
      }
      err.settle(comm);
    }

    // 7. Rank 0 publishes: verify, fsync, rename, fsync the directory, LATEST.
    int64_t file_bytes = 0;
    if (rank == 0) {
      try {
        publish(tmp, dir, name, true, &renamed);
        std::error_code ec;
        file_bytes = static_cast<int64_t>(fs::file_size(final_path, ec));
      } catch (...) {
        err.capture();
      }
    }
    err.settle(comm);
    comm.allreduce_sum(&file_bytes, 1);
    res.file_bytes = file_bytes;
  } catch (...) {
    if (rank == 0 && !renamed) ::unlink(tmp.c_str());
    throw;
  }
  res.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void load_checkpoint_file(const std::string& path, TrainState& s, bool subset) {
  H5Lock lock;  // the whole load: loader workers wait (this happens at start or on resume)
  FileReader rd(path);
  const StateScalars sc = rd.state();
  const ParamSet& ps = s.params;
  RUNNER_CHECK(ps.names.size() == ps.values.size(), "ParamSet names and values differ in length");
  // Every RNG in the runner is counter-based and layout-independent, and the data cursor counts
  // global samples, so a rank of another layout continues from rank 0's entries.
  const int src_rank = rd.exists(fmt::format("/rng/rank_{}", s.world_rank)) ? s.world_rank : 0;

  // 1. Structure of everything, before any data is read.
  struct Planned {
    DsInfo d;
    ops::Tensor* dst;   // nullptr: moment to be allocated (index below)
    size_t index;
    int which;          // 0 param, 1 adam_m, 2 adam_v
    ops::DType stored;
  };
  std::vector<Planned> plan;
  std::set<std::string> expected_names(ps.names.begin(), ps.names.end());
  for (size_t i = 0; i < ps.names.size(); ++i) {
    DsInfo d = rd.info("/params/" + ps.names[i]);
    rd.expect(d, ps.values[i].shape(), ps.values[i].dtype(), "parameter");
    plan.push_back({d, &s.params.values[i], i, 0, ps.values[i].dtype()});
  }
  for (auto& n : rd.members("/params"))
    if (!subset && !expected_names.count(n))
      bad(path, "dataset /params/" + n + " is a parameter the model does not have",
          "the recipe's model differs from the one that wrote this checkpoint; resume with the stored recipe");
  const bool have_moments = !s.adam_m.empty();
  for (int which = 1; which <= 2; ++which) {
    const std::string g = which == 1 ? "/optimizer/adam_m" : "/optimizer/adam_v";
    for (size_t i = 0; i < ps.names.size(); ++i) {
      DsInfo d = rd.info(g + "/" + ps.names[i]);
      ops::DType stored = d.dtype == "bf16" ? ops::DType::BF16 : ops::DType::F32;
      rd.expect(d, ps.values[i].shape(), stored, "Adam moment, fp32 or bf16");
      plan.push_back({d, nullptr, i, which, stored});
    }
    for (auto& n : rd.members(g))
      if (!subset && !expected_names.count(n)) bad(path, "dataset " + g + "/" + n + " is a moment of a parameter the model does not have");
  }
  const std::string rng_path = fmt::format("/rng/rank_{}", src_rank);
  const std::string data_path = fmt::format("/data/rank_{}", src_rank);
  for (const std::string& p : {rng_path, data_path, std::string("/recipe")}) rd.check_storage(rd.info(p));

  // 2. Small datasets (checksummed) into locals.
  const std::vector<uint64_t> rng = rd.u64_array(rng_path, 5);
  const std::vector<uint64_t> cursor = rd.u64_array(data_path, 2);
  if (cursor[0] > static_cast<uint64_t>(INT64_MAX)) bad(path, "dataset " + data_path + " holds a negative sample cursor", kCorruptFix);
  std::string recipe = rd.text("/recipe");

  // 3. Tensors, each checksummed as read.
  if (!have_moments) {
    s.adam_m.clear();
    s.adam_v.clear();
    for (auto& p : ps.values) {
      s.adam_m.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
      s.adam_v.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
    }
  }
  for (auto& pl : plan) {
    ops::Tensor& dst = pl.which == 0 ? *pl.dst : (pl.which == 1 ? s.adam_m[pl.index] : s.adam_v[pl.index]);
    RUNNER_CHECK(dst.shape() == pl.d.shape, "state tensor for " + pl.d.path + " has shape " + dst.shape_str());
    if (pl.which != 0) RUNNER_CHECK(dst.dtype() == ops::DType::F32, "Adam moments must be fp32");
    if (pl.stored == dst.dtype()) {
      rd.read(pl.d, dst.raw(), [](const char*, uint64_t, size_t) {});
    } else {  // bf16 on disk -> fp32 in memory
      float* out = dst.data<float>();
      rd.read(pl.d, nullptr, [out](const char* p, uint64_t off, size_t n) {
        for (size_t i = 0; i < n / 2; ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[off / 2 + i] = bf16_to_f32(h);
        }
      });
    }
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

struct ScanEntry {
  DsInfo d;
  std::optional<uint32_t> computed;  // set when the bytes were read
  std::string problem;               // empty: verified
};

// Metadata of every dataset (under the lock), then their bytes (without it).
std::vector<ScanEntry> scan(const FileReader& rd) {
  std::vector<ScanEntry> out;
  for (auto& p : rd.list_datasets()) {
    ScanEntry e;
    try {
      e.d = rd.info(p);
    } catch (const UserError& err) {
      e.d.path = p;
      e.problem = err.problem();
      out.push_back(std::move(e));
      continue;
    }
    if (!e.d.problem.empty()) {
      e.problem = e.d.problem;
    } else {
      try {
        uint32_t crc = 0;
        rd.read(e.d, nullptr, [&crc](const char* b, uint64_t, size_t n) { crc = crc32c(crc, b, n); });
        e.computed = crc;
      } catch (const UserError& err) {
        e.problem = err.problem();
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

namespace {

// What a checkpoint must hold besides checksummed bytes: /recipe, at least one rank's /rng and
// /data, and an optimizer tree that mirrors /params name for name.
std::vector<std::string> structure_problems(const FileReader& rd) {
  std::vector<std::string> out;
  if (!rd.exists("/recipe")) out.push_back("dataset /recipe is missing");
  for (const char* g : {"/rng", "/data"})
    if (rd.members(g).empty()) out.push_back(fmt::format("group {} holds no rank_<r> dataset", g));
  const auto params = rd.members("/params");
  if (params.empty()) out.push_back("group /params is missing or empty");
  const std::set<std::string> pset(params.begin(), params.end());
  for (const char* g : {"/optimizer/adam_m", "/optimizer/adam_v"}) {
    const auto mom = rd.members(g);
    const std::set<std::string> mset(mom.begin(), mom.end());
    for (auto& n : params)
      if (!mset.count(n)) out.push_back(fmt::format("dataset {}/{} is missing (the optimizer tree mirrors /params)", g, n));
    for (auto& n : mom)
      if (!pset.count(n)) out.push_back(fmt::format("dataset {}/{} has no parameter /params/{}", g, n, n));
  }
  return out;
}

}  // namespace

void verify_checkpoint_file(const std::string& path) {
  FileReader rd(path);
  rd.state();
  for (auto& p : structure_problems(rd)) bad(path, p, kCorruptFix);
  for (auto& e : scan(rd))
    if (!e.problem.empty()) bad(path, e.problem.rfind("dataset ", 0) == 0 ? e.problem : "dataset " + e.d.path + " " + e.problem, kCorruptFix);
}

std::string read_recipe_text(const std::string& path) {
  FileReader rd(path);
  rd.state();
  return rd.text("/recipe");
}

int64_t read_checkpoint_step(const std::string& path) {
  FileReader rd(path);
  return rd.state().step;
}

std::string inspect_checkpoint(const std::string& path, bool* ok_out) {
  FileReader rd(path);
  std::string out = fmt::format("checkpoint {} ({} bytes)\n", path, rd.file_size());
  bool ok = true;
  StateScalars sc;
  try {
    sc = rd.state();
    out += fmt::format("  format {}, written by runner {}\n", sc.format_version, sc.program_version);
    out += fmt::format("  step {}, tokens {}, loss_ema {:.6g}, loss scale {:g} (good steps {}, skipped {}), world size {}\n",
                       sc.step, sc.tokens, sc.loss_ema, sc.scale, sc.good_steps, sc.skipped_steps, sc.world_size);
  } catch (const UserError& e) {
    ok = false;
    out += "  /state: BAD: " + e.problem() + "\n";
  }
  try {
    out += "  recipe: " + summarize_recipe(rd.text("/recipe")) + "\n";
  } catch (const UserError& e) {
    out += "  recipe: BAD: " + e.problem() + "\n";
  }
  for (auto& grp : {std::string("/rng"), std::string("/data")}) {
    for (auto& m : rd.members(grp)) {
      try {
        bool is_rng = grp == "/rng";
        auto v = rd.u64_array(grp + "/" + m, is_rng ? 5 : 2);
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
  auto entries = scan(rd);
  size_t width = 8;
  for (auto& e : entries) width = std::max(width, e.d.path.size());
  out += "  datasets:\n";
  int bad_count = 0;
  uint64_t total = 0;
  for (auto& e : entries) {
    total += e.problem.empty() ? e.d.expected_bytes() : 0;
    std::string status = e.problem.empty() ? fmt::format("crc32c {:#010x} ok", *e.computed) : "BAD: " + e.problem;
    if (!e.problem.empty()) ++bad_count;
    out += fmt::format("    {:<{}}  {:<16} {:<8} {:>12}  {}\n", e.d.path, width, ops::shape_to_string(e.d.shape), e.d.dtype,
                       e.d.expected_bytes(), status);
  }
  for (auto& p : structure_problems(rd)) {
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
