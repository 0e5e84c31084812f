// HDF5 token files: the "hdf5" source and `runner data prepare` (text -> HDF5).
//
// A token file is one 1-D integer dataset (uint16, or int32 for vocabularies past 65535),
// chunked and deflate-compressed, with attributes vocab_size, tokenizer, source and
// max_token.
//
// Reading: a split that fits in hdf5_in_memory_limit() (512 MiB by default) is read once at
// open and served from memory. A larger one is streamed: each window is a hyperslab read,
// and since the HDF5 library on this system is built without thread safety every HDF5 call
// holds the process-wide h5::Lock (runner/hdf5/hdf5.h, the one locking rule), so loader
// workers serialize on it, per window. Chunks are small (4 Ki tokens,
// 8 KiB, deflate level 1 after byte-shuffle) so a random window inflates little.
//
// max_token: prepare stores it. A file without it is scanned once at open; one with it is
// trusted but verified: fully when held in memory, else at both ends at open and window by
// window as read. Either way a token >= vocab_size (or < 0) is a UserError naming the
// file instead of an index past an embedding table.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"

namespace runner {
namespace data_detail {

namespace {

constexpr hsize_t kChunkTokens = 4096;          // 8 KiB: a random window inflates little
constexpr int kDeflateLevel = 1;                // level 1: most of the ratio, several times the speed
constexpr int64_t kScanBlock = 1 << 20;      // tokens per read when scanning
constexpr int64_t kVerifyBlock = 1 << 16;    // tokens checked at each end against max_token
constexpr size_t kChunkCacheBytes = 8 << 20;

using h5::Id;

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* op) {
  static_cast<std::vector<std::string>*>(op)->push_back(name);
  return 0;
}

std::string root_names(hid_t file) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Literate(file, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect_name, &names);
  if (names.empty()) return "the file is empty";
  std::string s = "found: ";
  for (size_t i = 0; i < names.size() && i < 10; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 10) s += ", ...";
  return s;
}

std::string type_name(hid_t type) {
  const size_t bytes = H5Tget_size(type);
  const std::string bits = std::to_string(8 * bytes);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "a non-integer type (" + bits + " bits)";
  }
}

// Reads an integer attribute of `obj`; false when it does not exist or is not an integer.
bool read_i64_attr(hid_t obj, const char* name, int64_t& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return false;
  Id type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) return false;
  return H5Aread(attr.get(), H5T_NATIVE_INT64, &out) >= 0;
}

class Hdf5Source final : public WindowSource {
 public:
  Hdf5Source(const std::string& path, const std::string& dataset, SplitRange range, int64_t T)
      : WindowSource(path, range, T), dataset_(dataset) {}
  ~Hdf5Source() override {
    h5::Lock lock;
    close_locked();
  }

  std::string describe() const override {
    return "hdf5 " + path_ + ":/" + dataset_ + " (" + dtype_ + (in_memory_ ? ", split held in memory" : ", streamed") +
           (attr_max_ ? ", max_token attribute" : "") + "): " + describe_windows(n_);
  }
  int64_t max_token() const override { return max_token_; }

  // Everything open_hdf5 checks, in order; the caller holds the HDF5 lock.
  void open(const DataConfig& cfg, Split split, bool whole, int64_t vocab_size, bool may_hold) {
    const SourceLoc loc{path_};
    const std::string what_kind = "kind hdf5 expects an HDF5 file with a 1-D uint16 or int32 dataset '" + dataset_ + "'";
    if (H5Fis_hdf5(path_.c_str()) <= 0)
      throw UserError(loc, "not an HDF5 file (" + what_kind + ")",
                      "make one with `runner data prepare`, or set data.kind to text or bin");
    file_ = Id(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.ok())
      throw UserError(loc, "cannot open the HDF5 file (corrupt, or locked by a writer?)",
                      "check it with h5dump; if another process writes it, set HDF5_USE_FILE_LOCKING=FALSE");
    Id dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
    H5Pset_chunk_cache(dapl.get(), 521, kChunkCacheBytes, 0.75);
    dset_ = Id(H5Dopen2(file_.get(), dataset_.c_str(), dapl.get()), H5Dclose);
    if (!dset_.ok())
      throw UserError(loc, "no dataset '" + dataset_ + "' (expected a 1-D uint16 or int32 token dataset; " +
                               root_names(file_.get()) + ")",
                      "set data.dataset to the token dataset's name");
    Id type(H5Dget_type(dset_.get()), H5Tclose);
    const bool is_int = H5Tget_class(type.get()) == H5T_INTEGER;
    const size_t bytes = H5Tget_size(type.get());
    const bool is_unsigned = is_int && H5Tget_sign(type.get()) == H5T_SGN_NONE;
    dtype_ = type_name(type.get());
    if (!(is_int && ((bytes == 2 && is_unsigned) || (bytes == 4 && !is_unsigned))))
      throw UserError(loc, "dataset '" + dataset_ + "' holds " + dtype_ + "; expected uint16 or int32 token ids",
                      "write the tokens as uint16 (vocab <= 65536) or int32");
    wide_ = bytes == 4;
    space_ = Id(H5Dget_space(dset_.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space_.get());
    if (rank != 1) {
      std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
      if (rank > 0) H5Sget_simple_extent_dims(space_.get(), dims.data(), nullptr);
      std::string shape;
      for (size_t i = 0; i < dims.size(); ++i) shape += (i ? "x" : "") + std::to_string(dims[i]);
      throw UserError(loc, "dataset '" + dataset_ + "' has rank " + std::to_string(rank) +
                               (shape.empty() ? "" : " (shape " + shape + ")") + "; expected a 1-D token array",
                      "flatten the tokens into one 1-D dataset");
    }
    hsize_t dim = 0;
    H5Sget_simple_extent_dims(space_.get(), &dim, nullptr);
    n_ = static_cast<int64_t>(dim);
    range_ = split_range(n_, cfg, split, whole);
    check_split_length(path_, n_, range_, split, whole, T_);

    int64_t attr = 0;
    attr_max_ = read_i64_attr(dset_.get(), "max_token", attr);
    const std::string attr_bound = "its max_token attribute " + std::to_string(attr);
    const int64_t region = range_.end - range_.begin;
    in_memory_ = may_hold && region * (wide_ ? 4 : 2) <= hdf5_in_memory_limit().load();
    if (in_memory_) {
      // Small enough: read the split once, verify every token, serve windows from memory.
      max_token_ = attr_max_ ? attr : std::numeric_limits<int32_t>::max();
      if (wide_) {
        mem32_.resize(static_cast<size_t>(region));
        read_block_locked(range_.begin, region, H5T_NATIVE_INT32, mem32_.data());
        const int64_t mx = verify(range_.begin, mem32_.data(), region, attr_bound);
        if (!attr_max_) max_token_ = mx;
      } else {
        mem16_.resize(static_cast<size_t>(region));
        read_block_locked(range_.begin, region, H5T_NATIVE_UINT16, mem16_.data());
        const int64_t mx = verify(range_.begin, mem16_.data(), region, attr_bound);
        if (!attr_max_) max_token_ = mx;
      }
      close_locked();  // nothing more to read: release the file
    } else if (attr_max_) {
      // Trust, but verify the ends of the dataset now and every window as it is read.
      max_token_ = attr;
      scan(0, std::min(n_, kVerifyBlock), attr_bound);
      scan(std::max<int64_t>(0, n_ - kVerifyBlock), n_, attr_bound);
    } else {
      max_token_ = std::numeric_limits<int32_t>::max();
      max_token_ = scan(range_.begin, range_.end, "");
    }
    if (max_token_ >= vocab_size)
      throw UserError(loc, "dataset '" + dataset_ + "' holds tokens up to " + std::to_string(max_token_) +
                               (attr_max_ ? " (its max_token attribute)" : "") + " but model.vocab_size is " +
                               std::to_string(vocab_size),
                      "set model.vocab_size >= " + std::to_string(max_token_ + 1) +
                          " (the data's tokenizer vocabulary), or re-tokenize the data");
  }

 protected:
  void read(int64_t start, int64_t count, int32_t* out) const override {
    if (in_memory_) {
      const size_t o = static_cast<size_t>(start - range_.begin);
      if (wide_) std::copy(mem32_.begin() + o, mem32_.begin() + o + count, out);
      else std::copy(mem16_.begin() + o, mem16_.begin() + o + count, out);
      return;
    }
    h5::Lock lock;
    read_block_locked(start, count, H5T_NATIVE_INT32, out);
    verify(start, out, count, "its max_token attribute " + std::to_string(max_token_));
  }

 private:
  void close_locked() {
    space_.reset();
    dset_.reset();
    file_.reset();
  }

  // Reads tokens [start, start+count) converted to `mem_type`, in blocks of kScanBlock.
  void read_block_locked(int64_t start, int64_t count, hid_t mem_type, void* out) const {
    const size_t elem = H5Tget_size(mem_type);
    for (int64_t s = 0; s < count; s += kScanBlock) {
      hsize_t st = static_cast<hsize_t>(start + s), cnt = static_cast<hsize_t>(std::min(kScanBlock, count - s));
      Id mspace(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
      if (H5Sselect_hyperslab(space_.get(), H5S_SELECT_SET, &st, nullptr, &cnt, nullptr) < 0 || !mspace.ok() ||
          H5Dread(dset_.get(), mem_type, mspace.get(), space_.get(), H5P_DEFAULT,
                  static_cast<char*>(out) + static_cast<size_t>(s) * elem) < 0)
        throw UserError(SourceLoc{path_}, "cannot read tokens [" + std::to_string(st) + ", " +
                                              std::to_string(st + cnt) + ") of dataset '" + dataset_ + "'",
                        "the file may be corrupt: check it with h5dump, or prepare it again");
    }
  }

  // Checks every token lies in [0, max_token_] (`bound` says where that bound came from)
  // and returns the largest.
  template <class E>
  int64_t verify(int64_t start, const E* t, int64_t count, const std::string& bound) const {
    int64_t mx = 0, mn = 0;
    for (int64_t i = 0; i < count; ++i) {  // branch-free: vectorizes
      mx = std::max<int64_t>(mx, t[i]);
      mn = std::min<int64_t>(mn, t[i]);
    }
    if (mn >= 0 && mx <= max_token_) return mx;
    for (int64_t i = 0; i < count; ++i) {
      if (t[i] >= 0 && t[i] <= max_token_) continue;
      const std::string where = " at index " + std::to_string(start + i) + " of dataset '" + dataset_ + "'";
      if (t[i] < 0)
        throw UserError(SourceLoc{path_}, "negative token " + std::to_string(t[i]) + where,
                        "token ids must be >= 0: re-tokenize the data");
      throw UserError(SourceLoc{path_}, "token " + std::to_string(t[i]) + where + " exceeds " + bound,
                      "the file is inconsistent: prepare it again");
    }
    return mx;
  }

  // Streams [a, b) through a block buffer, verifying; returns the largest token.
  int64_t scan(int64_t a, int64_t b, const std::string& bound) {
    std::vector<int32_t> buf(static_cast<size_t>(std::min(kScanBlock, std::max<int64_t>(b - a, 1))));
    int64_t mx = 0;
    for (int64_t s = a; s < b; s += kScanBlock) {
      const int64_t c = std::min(kScanBlock, b - s);
      read_block_locked(s, c, H5T_NATIVE_INT32, buf.data());
      mx = std::max(mx, verify(s, buf.data(), c, bound));
    }
    return mx;
  }

  std::string dataset_, dtype_;
  Id file_, dset_, space_;  // space_: the dataset's file space, reused for every selection
  int64_t n_ = 0, max_token_ = 0;
  bool attr_max_ = false, wide_ = false, in_memory_ = false;
  std::vector<uint16_t> mem16_;  // the split's tokens when held in memory (uint16 files)
  std::vector<int32_t> mem32_;   // ... (int32 files)
};

void write_attr(hid_t obj, const char* name, int64_t v) {
  if (!h5::write_attr(obj, name, H5T_STD_I64LE, &v)) throw std::runtime_error(std::string("cannot write attribute ") + name);
}

void write_attr(hid_t obj, const char* name, const std::string& v) {
  const std::string padded = v.empty() ? std::string(1, '\0') : v;
  Id type = h5::string_type(padded.size(), H5T_CSET_ASCII);
  if (!h5::write_attr(obj, name, type, padded.data()))
    throw std::runtime_error(std::string("cannot write attribute ") + name);
}

}  // namespace

std::atomic<int64_t>& hdf5_in_memory_limit() {
  static std::atomic<int64_t> bytes{int64_t{512} << 20};
  return bytes;
}

std::unique_ptr<WindowSource> open_hdf5(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                        int64_t T, int64_t vocab_size, bool may_hold) {
  auto src = std::make_unique<Hdf5Source>(path, cfg.dataset, SplitRange{}, T);
  {
    h5::Lock lock;
    src->open(cfg, split, whole, vocab_size, may_hold);
  }
  return src;
}

}  // namespace data_detail

namespace data_detail {
namespace {

// The text to prepare, opened, and the output's folder, made (invariant 6: every mistake is
// reported before anything is written).
std::ifstream open_prepare_paths(const std::string& text_path, const std::string& out_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(text_path, ec))
    throw UserError(SourceLoc{text_path}, "text file not found", "check the path to the text to prepare");
  if (!fs::is_regular_file(text_path, ec))
    throw UserError(SourceLoc{text_path}, "not a regular file", "give a text file to prepare");
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw UserError(SourceLoc{text_path}, "cannot open for reading", "check the file's permissions");
  const fs::path out(out_path);
  if (fs::is_directory(out, ec))
    throw UserError(SourceLoc{out_path}, "output path is a directory", "give a file name such as data/tokens.h5");
  if (out.has_parent_path()) {
    fs::create_directories(out.parent_path(), ec);
    if (ec)
      throw UserError(SourceLoc{out_path}, "cannot create the output directory: " + ec.message(),
                      "check permissions or choose another output path");
  }
  return in;
}

// A binary file (an HDF5 or token file, a tarball) tokenized byte by byte trains on noise:
// refused unless asked for. Reads the first kNotTextSample bytes, then rewinds.
void refuse_binary(std::ifstream& in, const std::string& text_path) {
  std::vector<unsigned char> head(static_cast<size_t>(kNotTextSample));
  in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
  const int64_t got = in.gcount();
  in.clear();
  in.seekg(0);
  if (const auto bin = not_text(head.data(), got))
    throw UserError(SourceLoc{text_path}, bin->what + "; prepare tokenizes UTF-8 text byte by byte",
                    (bin->kind.empty() ? std::string("give the text file itself")
                                       : "train on it directly with data.kind: " + bin->kind + " (no preparing needed)") +
                        ", or pass --binary-ok to tokenize its bytes anyway");
}

// The prepared file being written: an extendible, chunked, compressed uint16 'tokens' dataset.
struct TokenFile {
  Id file, dset;
};

template <class Fail>
TokenFile create_token_file(const std::string& tmp, Fail&& fail, hid_t file_type = H5T_STD_U16LE) {
  TokenFile t;
  t.file = Id(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!t.file.ok()) fail("cannot create " + tmp);
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = kChunkTokens;
  Id space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // No object timestamps: the same tokens give the same bytes (prepare's output is reproducible).
  if (!space.ok() || !dcpl.ok() || H5Pset_chunk(dcpl.get(), 1, &chunk) < 0 || H5Pset_shuffle(dcpl.get()) < 0 ||
      H5Pset_deflate(dcpl.get(), kDeflateLevel) < 0 || H5Pset_obj_track_times(dcpl.get(), false) < 0)
    fail("cannot set up the dataset layout (is deflate available in this HDF5?)");
  t.dset = Id(H5Dcreate2(t.file.get(), "tokens", file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
              H5Dclose);
  if (!t.dset.ok()) fail("cannot create dataset 'tokens'");
  return t;
}

// Streams the bytes of `in` into the dataset, one token per byte, in bounded pieces. Returns the
// token count; `max_token` gets the largest.
template <class Fail>
int64_t stream_byte_tokens(std::ifstream& in, hid_t dset, const std::string& text_path, const std::string& out_path,
                           const std::atomic<bool>* stop, int64_t& max_token, Fail&& fail) {
  constexpr size_t kReadBytes = 1 << 20;
  std::vector<char> bytes(kReadBytes);
  std::vector<uint16_t> tokens(kReadBytes);
  int64_t n = 0;
  for (;;) {
    if (stop && stop->load())
      throw UserError(SourceLoc{text_path}, "interrupted",
                      "nothing was written to " + out_path + "; run the command again");
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const hsize_t got = static_cast<hsize_t>(in.gcount());
    if (got == 0) break;
    for (hsize_t i = 0; i < got; ++i) {
      tokens[i] = static_cast<unsigned char>(bytes[i]);
      max_token = std::max<int64_t>(max_token, tokens[i]);
    }
    const hsize_t start = static_cast<hsize_t>(n), new_size = start + got;
    if (H5Dset_extent(dset, &new_size) < 0) fail("cannot extend dataset 'tokens'");
    Id fspace(H5Dget_space(dset), H5Sclose);
    Id mspace(H5Screate_simple(1, &got, nullptr), H5Sclose);
    if (!fspace.ok() || !mspace.ok() ||
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &got, nullptr) < 0 ||
        H5Dwrite(dset, H5T_NATIVE_UINT16, mspace.get(), fspace.get(), H5P_DEFAULT, tokens.data()) < 0)
      fail("cannot write tokens (disk full?)");
    n += static_cast<int64_t>(got);
  }
  return n;
}

// Appends one block of tokens at the end of the extendible dataset.
template <class Fail>
void append_tokens(hid_t dset, int64_t at, const int32_t* tokens, int64_t n, Fail&& fail) {
  const hsize_t start = static_cast<hsize_t>(at), got = static_cast<hsize_t>(n), new_size = start + got;
  if (H5Dset_extent(dset, &new_size) < 0) fail("cannot extend dataset 'tokens'");
  Id fspace(H5Dget_space(dset), H5Sclose);
  Id mspace(H5Screate_simple(1, &got, nullptr), H5Sclose);
  if (!fspace.ok() || !mspace.ok() ||
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &got, nullptr) < 0 ||
      H5Dwrite(dset, H5T_NATIVE_INT32, mspace.get(), fspace.get(), H5P_DEFAULT, tokens) < 0)
    fail("cannot write tokens (disk full?)");
}

// A shard of a prepared dataset (see ShardWriter). HDF5 calls hold h5::Lock per call: the
// writer runs on prepare's one writing thread, but the lock is the process's rule.
class H5ShardWriter final : public ShardWriter {
  struct Fail {
    std::string path;
    [[noreturn]] void operator()(const std::string& what) const {
      throw UserError(SourceLoc{path}, what, "check free disk space and permissions; nothing was written");
    }
  };

 public:
  H5ShardWriter(std::string path, bool wide, int64_t vocab, std::string tokenizer)
      : path_(std::move(path)), vocab_(vocab), tokenizer_(std::move(tokenizer)) {
    h5::Lock lock;
    t_ = create_token_file(path_, fail_fn(), wide ? H5T_STD_I32LE : H5T_STD_U16LE);
  }
  ~H5ShardWriter() override {
    h5::Lock lock;
    t_.dset.reset();
    t_.file.reset();
  }
  void append(const int32_t* tokens, int64_t n) override {
    if (n == 0) return;
    h5::Lock lock;
    append_tokens(t_.dset.get(), n_, tokens, n, fail_fn());
    n_ += n;
  }
  void finish(int64_t max_token) override {
    h5::Lock lock;
    try {
      write_attr(t_.dset.get(), "vocab_size", vocab_);
      write_attr(t_.dset.get(), "tokenizer", tokenizer_);
      write_attr(t_.dset.get(), "max_token", max_token);
    } catch (const std::runtime_error& e) {
      fail_fn()(e.what());
    }
    if (!t_.dset.close() || !t_.file.close()) fail_fn()("cannot finish writing (disk full?)");
  }

 private:
  Fail fail_fn() const { return Fail{path_}; }
  std::string path_;
  int64_t vocab_, n_ = 0;
  std::string tokenizer_;
  TokenFile t_;
};

}  // namespace

std::unique_ptr<ShardWriter> h5_shard_writer(const std::string& path, bool wide, int64_t vocab_size,
                                             const std::string& tokenizer) {
  return std::make_unique<H5ShardWriter>(path, wide, vocab_size, tokenizer);
}

}  // namespace data_detail

// `runner data prepare`: stream a text file through the byte tokenizer into HDF5.
int64_t prepare_text_to_hdf5(const std::string& text_path, const std::string& out_path,
                             const std::atomic<bool>* stop, bool binary_ok) {
  using namespace data_detail;
  namespace fs = std::filesystem;
  std::ifstream in = open_prepare_paths(text_path, out_path);
  if (!binary_ok) refuse_binary(in, text_path);
  std::error_code ec;
  const std::string tmp = out_path + ".tmp." + std::to_string(::getpid());
  std::string abs_source = fs::absolute(text_path, ec).string();
  if (ec) abs_source = text_path;

  h5::Lock lock;
  // Declared before the HDF5 handles, so it runs after they are closed: removes the
  // temporary file on any failure or interruption.
  struct RemoveTemp {
    std::string path;
    bool keep = false;
    ~RemoveTemp() {
      std::error_code e;
      if (!keep) fs::remove(path, e);
    }
  } guard{tmp};
  auto fail = [&](const std::string& what) {
    throw UserError(SourceLoc{out_path}, what, "check free disk space and permissions; nothing was written");
  };

  TokenFile t = create_token_file(tmp, fail);
  int64_t max_token = 0;
  const int64_t n = stream_byte_tokens(in, t.dset.get(), text_path, out_path, stop, max_token, fail);
  if (in.bad()) throw UserError(SourceLoc{text_path}, "read error", "check the file and the disk");
  if (n == 0) throw UserError(SourceLoc{text_path}, "is empty: nothing to prepare", "give a non-empty text file");
  try {
    write_attr(t.dset.get(), "vocab_size", int64_t{256});
    write_attr(t.dset.get(), "tokenizer", std::string("byte"));
    write_attr(t.dset.get(), "source", abs_source);
    write_attr(t.dset.get(), "max_token", max_token);
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
  if (!t.dset.close() || !t.file.close()) fail("cannot finish writing " + tmp + " (disk full?)");
  // Make the bytes durable before the rename makes them visible.
  int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    fail("cannot sync " + tmp);
  }
  ::close(fd);
  fs::rename(tmp, out_path, ec);
  if (ec) fail("cannot rename " + tmp + " to " + out_path + ": " + ec.message());
  guard.keep = true;
  return n;
}

}  // namespace runner
