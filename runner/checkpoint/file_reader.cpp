// Reading a checkpoint as untrusted input (see file_reader.h), and the whole-file walks that
// verify it.
#include "runner/checkpoint/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <type_traits>

namespace runner::ckpt {

namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxRecipeBytes = 64u << 20;  // an untrusted file cannot make us allocate more
constexpr size_t kMaxStringAttrBytes = 1u << 20;
// Why the dataset's bytes cannot be read where and as its metadata says ("" when they can):
// fixed-size type, contiguous, storage = shape x type size (computed without overflow), inside
// the file, with a checksum.
std::string storage_problem(const DsInfo& d, bool variable_length, uint64_t file_size) {
  uint64_t expect = d.type_size;
  bool overflow = false;
  for (auto x : d.shape) {
    if (x != 0 && expect > UINT64_MAX / static_cast<uint64_t>(x)) overflow = true;
    expect *= static_cast<uint64_t>(x);
  }
  if (variable_length) return "holds variable-length data (runner writes fixed-size types only)";
  if (overflow) return "claims a size that overflows 64 bits";
  if (!d.contiguous) return "is not stored contiguously (chunked, compressed or compact; runner writes contiguous datasets)";
  if (expect > 0 && (d.offset == HADDR_UNDEF || d.storage == 0))
    return fmt::format("holds no data (shape {} x {} bytes needs {} bytes)", ops::shape_to_string(d.shape), d.type_size, expect);
  if (d.storage != expect)
    return fmt::format("stores {} bytes but shape {} x {} bytes needs {}", d.storage, ops::shape_to_string(d.shape),
                       d.type_size, expect);
  if (expect > 0 && (d.offset > file_size || expect > file_size - d.offset))
    return fmt::format("ends at byte {} past the end of the file ({} bytes): truncated", d.offset + expect, file_size);
  if (!d.crc) return "has no crc32c attribute";
  return "";
}

// Bob Jenkins' lookup3 hashlittle, as HDF5 checksums its metadata (H5_checksum_lookup3).
uint32_t lookup3(const unsigned char* k, size_t length, uint32_t initval) {
  auto rot = [](uint32_t x, int r) { return (x << r) | (x >> (32 - r)); };
  uint32_t a, b, c;
  a = b = c = 0xdeadbeefu + static_cast<uint32_t>(length) + initval;
  auto word = [](const unsigned char* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  };
  while (length > 12) {
    a += word(k), b += word(k + 4), c += word(k + 8);
    a -= c, a ^= rot(c, 4), c += b;
    b -= a, b ^= rot(a, 6), a += c;
    c -= b, c ^= rot(b, 8), b += a;
    a -= c, a ^= rot(c, 16), c += b;
    b -= a, b ^= rot(a, 19), a += c;
    c -= b, c ^= rot(b, 4), b += a;
    length -= 12, k += 12;
  }
  if (length == 0) return c;
  unsigned char tail[12] = {};
  std::memcpy(tail, k, length);
  a += word(tail), b += word(tail + 4), c += word(tail + 8);
  c ^= b, c -= rot(b, 14);
  a ^= c, a -= rot(c, 11);
  b ^= a, b -= rot(a, 25);
  c ^= b, c -= rot(b, 16);
  a ^= c, a -= rot(c, 4);
  b ^= a, b -= rot(a, 14);
  c ^= b, c -= rot(b, 24);
  return c;
}

uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

void FileReader::check_superblock() const {
  // Version 2 and 3 superblocks (what libver v18..v110 writes): signature (8), version, size of
  // offsets, size of lengths, flags, base address, extension address, end-of-file address,
  // root group object header address (8 each), lookup3 checksum of the 44 bytes before it.
  static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char sb[48] = {};
  const ssize_t got = ::pread(fd_.fd, sb, sizeof sb, 0);
  if (got < 8 || std::memcmp(sb, kSig, 8) != 0)
    bad(path_, fmt::format("not an HDF5 file (no HDF5 signature in its {} bytes)", file_size_), kCorruptFix);
  if (sb[8] != 2 && sb[8] != 3)
    bad(path_, fmt::format("HDF5 superblock version {} is not one runner writes (2 or 3)", int{sb[8]}), kCorruptFix);
  if (got < static_cast<ssize_t>(sizeof sb))
    bad(path_, fmt::format("checkpoint is truncated ({} bytes on disk, inside the HDF5 superblock)", file_size_), kCorruptFix);
  if (sb[9] != 8 || sb[10] != 8)
    bad(path_, fmt::format("HDF5 superblock claims {}-byte offsets and {}-byte lengths (runner writes 8)", int{sb[9]}, int{sb[10]}),
        kCorruptFix);
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = stored << 8 | sb[44 + i];
  const uint32_t computed = lookup3(sb, 44, 0);
  if (stored != computed)
    bad(path_, fmt::format("HDF5 superblock fails its checksum (stored {:#010x}, computed {:#010x})", stored, computed),
        kCorruptFix);
  const uint64_t base = le64(sb + 12), ext = le64(sb + 20), eof = le64(sb + 28), root = le64(sb + 36);
  if (base != 0) bad(path_, fmt::format("HDF5 superblock has base address {} (runner writes 0)", base), kCorruptFix);
  if (eof > file_size_)
    bad(path_, fmt::format("checkpoint is truncated ({} bytes on disk; its HDF5 superblock says {})", file_size_, eof),
        kCorruptFix);
  if (root < sizeof sb || root >= eof || (ext != UINT64_MAX && (ext < sizeof sb || ext >= eof)))
    bad(path_, fmt::format("HDF5 superblock points outside the file (root group at {}, extension at {}, end {})", root,
                           ext == UINT64_MAX ? std::string("none") : std::to_string(ext), eof),
        kCorruptFix);
}

void bad(const std::string& path, const std::string& what, const std::string& fix) {
  throw UserError(SourceLoc{path, 0, 0}, what, fix);
}

FileReader::FileReader(std::string path) : path_(std::move(path)) {
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
  check_superblock();
  h5::Lock l;
  htri_t is = H5Fis_hdf5(path_.c_str());
  if (is <= 0) {
    h5::clear_errors();
    bad(path_, fmt::format("not an HDF5 file (no HDF5 signature in its {} bytes)", file_size_), kCorruptFix);
  }
  h5::Id fapl = file_access_plist();
  file_ = h5::Id(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file_.ok()) {
    std::string detail = h5::error_text();
    if (detail.find("truncated") != std::string::npos)
      bad(path_, fmt::format("checkpoint is truncated ({} bytes on disk; HDF5: {})", file_size_, detail), kCorruptFix);
    bad(path_, "cannot be opened as HDF5 (" + detail + ")", kCorruptFix);
  }
}

bool FileReader::exists(const std::string& p) const {
  h5::Lock l;
  size_t pos = 0;
  bool e = true;
  while (e && (pos = p.find('/', pos + 1)) != std::string::npos)
    e = H5Lexists(file_, p.substr(0, pos).c_str(), H5P_DEFAULT) > 0;
  e = e && H5Lexists(file_, p.c_str(), H5P_DEFAULT) > 0;
  h5::clear_errors();
  return e;
}

StateScalars FileReader::state() const {
  h5::Lock l;
  const std::string where = kStatePath;
  if (!exists(where)) bad(path_, "group /state is missing: not a runner checkpoint", kCorruptFix);
  h5::Id g(H5Oopen(file_, kStatePath, H5P_DEFAULT), H5Oclose);
  if (!g.ok() || H5Iget_type(g) != H5I_GROUP) bad(path_, "/state is not a group (" + h5::error_text() + ")", kCorruptFix);
  StateScalars s;
  // The version first: a newer format may have changed everything else.
  s.format_version = attr_i64(g, where, "format_version");
  if (s.format_version > kCheckpointFormatVersion)
    bad(path_, fmt::format("checkpoint format {} is newer than this runner's ({})", s.format_version, kCheckpointFormatVersion),
        "resume with the runner version that wrote it (see /state program_version), or a newer one");
  if (s.format_version < 1) bad(path_, fmt::format("/state format_version {} is invalid", s.format_version), kCorruptFix);
  for_each_state_field(s, [&](const char* name, auto& v) {
    using T = std::decay_t<decltype(v)>;
    if (std::strcmp(name, "format_version") == 0) return;  // read above
    if constexpr (std::is_same_v<T, int64_t>) v = attr_i64(g, where, name);
    else if constexpr (std::is_same_v<T, double>) v = attr_f64(g, where, name);
    else v = attr_str(g, where, name);
  });
  uint32_t stored = static_cast<uint32_t>(attr_i64(g, where, kCrcAttr));
  uint32_t computed = state_crc(s);
  if (stored != computed)
    bad(path_, fmt::format("/state attributes fail their checksum (stored crc32c {:#010x}, computed {:#010x})", stored, computed),
        kCorruptFix);
  if (H5Aexists(g, kThreadsAttr) > 0) s.omp_threads = attr_i64(g, where, kThreadsAttr);  // optional: older checkpoints lack it
  h5::clear_errors();
  if (s.step < 0 || s.tokens < 0 || s.world_size < 1)
    bad(path_, fmt::format("/state holds step {}, tokens {}, world_size {}", s.step, s.tokens, s.world_size), kCorruptFix);
  return s;
}

DsInfo FileReader::info(const std::string& p) const {
  h5::Lock l;
  if (!exists(p)) bad(path_, "dataset " + p + " is missing", kCorruptFix);
  h5::Id o(H5Oopen(file_, p.c_str(), H5P_DEFAULT), H5Oclose);
  if (!o.ok()) bad(path_, "dataset " + p + " cannot be opened (" + h5::error_text() + ")", kCorruptFix);
  if (H5Iget_type(o) != H5I_DATASET) bad(path_, p + " is not a dataset", kCorruptFix);
  return describe(o, p);
}

int64_t FileReader::format_hint() const {
  h5::Lock l;
  try {
    if (!exists(kStatePath)) return 0;
    h5::Id g(H5Oopen(file_, kStatePath, H5P_DEFAULT), H5Oclose);
    if (!g.ok() || H5Iget_type(g) != H5I_GROUP) {
      h5::clear_errors();
      return 0;
    }
    return attr_i64(g, kStatePath, "format_version");
  } catch (const UserError&) {
    h5::clear_errors();
    return 0;
  }
}

const std::vector<std::string>* FileReader::names() const {
  if (names_mode_ == Names::Unread) {
    h5::Lock l;
    // Only a file that says it is format 1 is iterated; any other (format 2, or a /state too
    // damaged to say) must list its datasets in /names.
    if (format_hint() == 1) {
      names_mode_ = Names::Iterate;
    } else {
      try {
        if (!exists(kNamesPath)) bad(path_, "dataset /names is missing", kCorruptFix);
        std::string problem;
        names_ = parse_names_text(text(kNamesPath), &problem);
        if (!problem.empty()) bad(path_, problem, kCorruptFix);
        names_mode_ = Names::Listed;
      } catch (const UserError& e) {
        names_mode_ = Names::Broken;
        names_problem_ = e.problem();
      }
    }
  }
  if (names_mode_ == Names::Broken)
    bad(path_, "cannot list the checkpoint's datasets: " + names_problem_ + " (format 2 lists them there)", kCorruptFix);
  return names_mode_ == Names::Listed ? &names_ : nullptr;
}

std::vector<std::string> FileReader::list_datasets() const {
  if (const auto* n = names()) {
    std::vector<std::string> out{kNamesPath};
    out.insert(out.end(), n->begin(), n->end());
    return out;
  }
  // Format 1: iterate (a damaged file can crash HDF5 here; see the header).
  h5::Lock l;
  struct Ctx {
    std::vector<std::string> out;
  } ctx;
  auto cb = [](hid_t g, const char* name, const H5L_info_t* li, void* op) -> herr_t {
    auto* c = static_cast<Ctx*>(op);
    if (li->type != H5L_TYPE_HARD) return 0;
    h5::Id o(H5Oopen(g, name, H5P_DEFAULT), H5Oclose);
    if (!o.ok()) {
      h5::clear_errors();
      c->out.push_back(std::string("/") + name);  // reported as unreadable by info()
      return 0;
    }
    if (H5Iget_type(o) == H5I_DATASET) c->out.push_back(std::string("/") + name);
    return 0;
  };
  if (H5Lvisit(file_, H5_INDEX_CRT_ORDER, H5_ITER_INC, cb, &ctx) < 0) {
    h5::clear_errors();
    ctx.out.clear();
    if (H5Lvisit(file_, H5_INDEX_NAME, H5_ITER_INC, cb, &ctx) < 0)
      bad(path_, "cannot list the file's datasets (" + h5::error_text() + ")", kCorruptFix);
  }
  return ctx.out;
}

std::vector<std::string> FileReader::members(const std::string& group) const {
  std::vector<std::string> out;
  if (const auto* n = names()) {
    const std::string prefix = group + "/";
    for (const std::string& p : *n)
      if (p.size() > prefix.size() && p.compare(0, prefix.size(), prefix) == 0 && p.find('/', prefix.size()) == std::string::npos)
        out.push_back(p.substr(prefix.size()));
    return out;
  }
  h5::Lock l;
  if (!exists(group)) return out;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* op) -> herr_t {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate_by_name(file_, group.c_str(), H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &out, H5P_DEFAULT) < 0)
    bad(path_, "cannot list group " + group + " (" + h5::error_text() + ")", kCorruptFix);
  return out;
}

bool FileReader::type_is(const std::string& p, hid_t type) const {
  h5::Lock l;
  h5::Id ds(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose);
  h5::Id t(H5Dget_type(ds), H5Tclose);
  return t.ok() && H5Tequal(t, type) > 0;
}

void FileReader::expect(const DsInfo& d, const std::vector<int64_t>& shape, ops::DType stored, const char* role) const {
  if (d.dtype != ops::dtype_name(stored))
    bad(path_, fmt::format("dataset {} holds {} but {} ({}) is expected", d.path, d.dtype, ops::dtype_name(stored), role),
        kCorruptFix);
  {
    h5::Lock l;
    if (!type_is(d.path, h5::file_type(stored)))
      bad(path_, fmt::format("dataset {} is stored as {} but {} needs {}", d.path, d.type_desc, ops::dtype_name(stored),
                             h5::describe_type(h5::file_type(stored))),
          kCorruptFix);
  }
  if (d.shape != shape)
    bad(path_, fmt::format("dataset {} has shape {} but the model expects {}", d.path, ops::shape_to_string(d.shape),
                           ops::shape_to_string(shape)),
        "the recipe's model differs from the one that wrote this checkpoint; resume with the stored recipe "
        "(runner resume RUN_DIR) or start a new run directory");
  check_storage(d);
}

void FileReader::check_storage(const DsInfo& d) const {
  if (!d.problem.empty()) bad(path_, "dataset " + d.path + " " + d.problem, kCorruptFix);
}

std::vector<char> FileReader::read_small(const DsInfo& d) const {
  std::vector<char> out(d.expected_bytes());
  read(d, out.data(), [](const char*, uint64_t, size_t) {});
  return out;
}

std::vector<uint64_t> FileReader::u64_array(const std::string& p, size_t n) const {
  DsInfo d = info(p);
  if (!type_is(p, H5T_STD_U64LE))
    bad(path_, fmt::format("dataset {} is stored as {} but uint64 is expected", p, d.type_desc), kCorruptFix);
  if (d.shape != std::vector<int64_t>{static_cast<int64_t>(n)})
    bad(path_, fmt::format("dataset {} has shape {} but ({}) is expected", p, ops::shape_to_string(d.shape), n), kCorruptFix);
  std::vector<char> raw = read_small(d);
  std::vector<uint64_t> v(n);
  std::memcpy(v.data(), raw.data(), n * 8);
  return v;
}

std::string FileReader::text(const std::string& p) const {
  DsInfo d = info(p);
  {
    h5::Lock l;
    h5::Id ds(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose);
    h5::Id t(H5Dget_type(ds), H5Tclose);
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

DsInfo FileReader::describe(hid_t ds, const std::string& p) const {
  DsInfo d;
  d.path = p;
  h5::Id space(H5Dget_space(ds), H5Sclose);
  h5::Id type(H5Dget_type(ds), H5Tclose);
  h5::Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!space.ok() || !type.ok() || !dcpl.ok()) {
    d.problem = "has unreadable metadata (" + h5::error_text() + ")";
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
  d.type_desc = h5::describe_type(type);
  d.dtype = d.type_desc;
  if (H5Aexists(ds, kDtypeAttr) > 0) {
    std::string s = attr_str(ds, p, kDtypeAttr);
    if (!s.empty()) d.dtype = s;
  }
  h5::clear_errors();
  if (H5Aexists(ds, kCrcAttr) > 0) d.crc = static_cast<uint32_t>(attr_i64(ds, p, kCrcAttr));
  h5::clear_errors();
  d.contiguous = H5Pget_layout(dcpl) == H5D_CONTIGUOUS;
  d.offset = H5Dget_offset(ds);
  d.storage = H5Dget_storage_size(ds);
  h5::clear_errors();
  d.problem = storage_problem(d, H5Tget_class(type) == H5T_VLEN || H5Tis_variable_str(type) > 0, file_size_);
  return d;
}

h5::Id FileReader::open_attr(hid_t obj, const std::string& where, const char* name, H5T_class_t cls) const {
  if (H5Aexists(obj, name) <= 0) bad(path_, fmt::format("attribute {} of {} is missing", name, where), kCorruptFix);
  h5::Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  h5::Id t(H5Aget_type(a), H5Tclose);
  h5::Id s(H5Aget_space(a), H5Sclose);
  if (!a.ok() || !t.ok() || !s.ok() || H5Tget_class(t) != cls || H5Sget_simple_extent_npoints(s) != 1)
    bad(path_, fmt::format("attribute {} of {} has the wrong type or size", name, where), kCorruptFix);
  return a;
}

int64_t FileReader::attr_i64(hid_t obj, const std::string& where, const char* name) const {
  h5::Id a = open_attr(obj, where, name, H5T_INTEGER);
  int64_t v = 0;
  if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
  return v;
}

double FileReader::attr_f64(hid_t obj, const std::string& where, const char* name) const {
  h5::Id a = open_attr(obj, where, name, H5T_FLOAT);
  double v = 0;
  if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
  return v;
}

std::string FileReader::attr_str(hid_t obj, const std::string& where, const char* name) const {
  h5::Id a = open_attr(obj, where, name, H5T_STRING);
  h5::Id t(H5Aget_type(a), H5Tclose);
  size_t n = H5Tget_size(t);
  if (H5Tis_variable_str(t) > 0 || n == 0 || n > kMaxStringAttrBytes)
    bad(path_, fmt::format("attribute {} of {} is not a fixed-length string", name, where), kCorruptFix);
  std::string s(n, '\0');
  if (H5Aread(a, t, s.data()) < 0) bad(path_, fmt::format("attribute {} of {} is unreadable", name, where), kCorruptFix);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// ---------------------------------------------------------------------------------------
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

std::vector<std::string> structure_problems(const FileReader& rd) {
  std::vector<std::string> out;
  if (!rd.exists(kRecipePath)) out.push_back(fmt::format("dataset {} is missing", kRecipePath));
  for (const char* g : {kRngGroup, kDataGroup})
    if (rd.members(g).empty()) out.push_back(fmt::format("group {} holds no rank_<r> dataset", g));
  const auto params = rd.members(tensor_group(kParam));
  if (params.empty()) out.push_back(fmt::format("group {} is missing or empty", tensor_group(kParam)));
  const std::set<std::string> pset(params.begin(), params.end());
  for (int which : {kAdamM, kAdamV}) {
    const char* g = tensor_group(which);
    const auto mom = rd.members(g);
    const std::set<std::string> mset(mom.begin(), mom.end());
    for (auto& n : params)
      if (!mset.count(n)) out.push_back(fmt::format("dataset {} is missing (the optimizer tree mirrors /params)", tensor_path(which, n)));
    for (auto& n : mom)
      if (!pset.count(n)) out.push_back(fmt::format("dataset {} has no parameter {}", tensor_path(which, n), tensor_path(kParam, n)));
  }
  return out;
}

}  // namespace runner::ckpt
