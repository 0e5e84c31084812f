// Memory-mapped file sources: UTF-8 text through the byte tokenizer, and uint16 .bin token
// files in the two formats found in the wild.
//
// .bin formats (both little-endian uint16 tokens):
//   nanoGPT  (prepare.py: np.array(ids, dtype=np.uint16).tofile) raw array, no header.
//   llm.c    (dev/data/data_common.py write_datafile) 256 int32 header: [0] = 20240520,
//            [1] = version 1, [2] = token count; then the tokens.
// The header is recognised by its magic. A raw file cannot be mistaken for one: the magic
// read as two uint16 tokens is (54984, 308), and 54984 lies outside GPT-2's 50257 tokens.
//
// Files are mapped read-only and scanned once at open for the largest token of the split,
// so a token >= vocab_size is reported before training instead of crashing an embedding.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"

namespace runner::data_detail {

namespace {

// A read-only mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw UserError(SourceLoc{path}, std::string("cannot open: ") + std::strerror(errno),
                      "check the file's permissions");
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int e = errno;
      ::close(fd_);
      throw UserError(SourceLoc{path}, std::string("cannot stat: ") + std::strerror(e), "check the file");
    }
    size_ = static_cast<int64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd_);
        throw UserError(SourceLoc{path}, std::string("cannot memory-map: ") + std::strerror(e),
                        "check the file system supports mmap");
      }
      data_ = static_cast<const unsigned char*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  int fd_ = -1;
  int64_t size_ = 0;
  const unsigned char* data_ = nullptr;
};

// Little-endian loads that work at any alignment and on any host.
uint16_t load_u16le(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
int32_t load_i32le(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

std::string token_range_hint(int64_t max_token) {
  return "set model.vocab_size >= " + std::to_string(max_token + 1) + " (the file's tokenizer vocabulary), or re-tokenize the data";
}

class TextSource final : public WindowSource {
 public:
  TextSource(const std::string& path, SplitRange range, int64_t T, std::unique_ptr<MappedFile> file, int64_t max_tok)
      : WindowSource(path, range, T), file_(std::move(file)), max_token_(max_tok) {}
  std::string describe() const override {
    return "text " + path_ + " (byte tokenizer): " + describe_windows(file_->size());
  }
  int64_t max_token() const override { return max_token_; }

 protected:
  void read(int64_t start, int64_t count, int32_t* out) const override {
    const unsigned char* p = file_->data() + start;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  }

 private:
  std::unique_ptr<MappedFile> file_;
  int64_t max_token_;
};

class BinSource final : public WindowSource {
 public:
  BinSource(const std::string& path, SplitRange range, int64_t T, std::unique_ptr<MappedFile> file, int64_t offset,
            int64_t n_tokens, bool llmc, int64_t max_tok)
      : WindowSource(path, range, T), file_(std::move(file)), offset_(offset), n_(n_tokens), llmc_(llmc),
        max_token_(max_tok) {}
  std::string describe() const override {
    return "bin " + path_ + (llmc_ ? " (llm.c v1 header, uint16): " : " (raw uint16, nanoGPT): ") +
           describe_windows(n_);
  }
  int64_t max_token() const override { return max_token_; }

 protected:
  void read(int64_t start, int64_t count, int32_t* out) const override {
    const unsigned char* p = file_->data() + offset_ + 2 * start;
    if constexpr (std::endian::native == std::endian::little) {
      const uint16_t* q = reinterpret_cast<const uint16_t*>(p);  // offset_ is 0 or 1024: aligned
      for (int64_t i = 0; i < count; ++i) out[i] = q[i];
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = load_u16le(p + 2 * i);
    }
  }

 private:
  std::unique_ptr<MappedFile> file_;
  int64_t offset_, n_;
  bool llmc_;
  int64_t max_token_;
};

// A shard in the llm.c layout: the 1 KiB header (its count written at finish), then uint16
// little-endian tokens. The caller keeps ids below 65536 and shards below 2^31 tokens.
class BinShardWriter final : public ShardWriter {
 public:
  explicit BinShardWriter(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) fail(std::string("cannot create: ") + std::strerror(errno));
    const std::string zeros(static_cast<size_t>(kLlmcHeaderBytes), '\0');
    put(zeros.data(), zeros.size());
  }
  ~BinShardWriter() override {
    if (f_) std::fclose(f_);
  }
  void append(const int32_t* tokens, int64_t n) override {
    buf_.resize(static_cast<size_t>(2 * n));
    for (int64_t i = 0; i < n; ++i) {
      buf_[static_cast<size_t>(2 * i)] = static_cast<unsigned char>(tokens[i] & 0xff);
      buf_[static_cast<size_t>(2 * i + 1)] = static_cast<unsigned char>((tokens[i] >> 8) & 0xff);
    }
    put(buf_.data(), buf_.size());
    n_ += n;
  }
  void finish(int64_t) override {
    unsigned char header[12];
    const int32_t h[3] = {kLlmcMagic, kLlmcVersion, static_cast<int32_t>(n_)};
    for (int k = 0; k < 3; ++k)
      for (int b = 0; b < 4; ++b) header[4 * k + b] = static_cast<unsigned char>((static_cast<uint32_t>(h[k]) >> (8 * b)) & 0xff);
    if (std::fseek(f_, 0, SEEK_SET) != 0) fail("cannot seek");
    put(header, sizeof header);
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) fail(std::string("cannot sync: ") + std::strerror(errno));
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) fail(std::string("cannot close: ") + std::strerror(errno));
  }

 private:
  void put(const void* p, size_t n) {
    if (std::fwrite(p, 1, n, f_) != n) fail(std::string("cannot write (disk full?): ") + std::strerror(errno));
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(SourceLoc{path_}, what, "check free disk space and permissions; nothing was written");
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<unsigned char> buf_;
  int64_t n_ = 0;
};

}  // namespace

std::unique_ptr<ShardWriter> bin_shard_writer(const std::string& path) { return std::make_unique<BinShardWriter>(path); }

std::optional<NotText> not_text(const unsigned char* bytes, int64_t n) {
  static const unsigned char kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(bytes, kHdf5, 8) == 0) return NotText{"is an HDF5 file (its signature opens it), not text", "hdf5"};
  if (n >= 4 && load_i32le(bytes) == kLlmcMagic) return NotText{"is an llm.c token file (its magic opens it), not text", "bin"};
  const int64_t m = std::min(n, kNotTextSample);
  if (const void* nul = m > 0 ? std::memchr(bytes, 0, static_cast<size_t>(m)) : nullptr) {
    const int64_t at = static_cast<const unsigned char*>(nul) - bytes;
    return NotText{"holds a NUL byte at offset " + std::to_string(at) + ": binary, not text (a uint16 token file?)",
                   n % 2 == 0 ? "bin" : ""};
  }
  // Invalid UTF-8: a few bytes of another encoding (Latin-1 accents) are still text; random or
  // compressed bytes start an invalid sequence about every other byte.
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i + 4 < m;) {
    const unsigned char c = bytes[i];
    const int64_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0;
    for (int64_t k = 1; ok && k < len; ++k) ok = (bytes[i + k] & 0xC0) == 0x80;
    if (!ok && first_bad < 0) first_bad = i;
    bad += ok ? 0 : 1;
    i += ok ? len : 1;
  }
  if (bad * 10 > m)
    return NotText{"is not UTF-8 text: " + std::to_string(bad) + " of its first " + std::to_string(m) +
                       " bytes start no valid character (the first at offset " + std::to_string(first_bad) + ")",
                   ""};
  return std::nullopt;
}

std::unique_ptr<DataSource> open_text(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                      int64_t T, int64_t vocab_size) {
  auto file = std::make_unique<MappedFile>(path);
  const int64_t n = file->size();
  if (const auto bin = not_text(file->data(), n))
    throw UserError(SourceLoc{path}, bin->what + " (data.kind text reads a UTF-8 text file byte by byte)",
                    bin->kind.empty() ? std::string("point data.path at the text to train on")
                                      : "set data.kind: " + bin->kind + " to read it as tokens, or point data.path at the text itself");
  const SplitRange r = split_range(n, cfg, split, whole);
  check_split_length(path, n, r, split, whole, T);
  unsigned char mx = 0;
  for (int64_t i = r.begin; i < r.end; ++i) mx = std::max(mx, file->data()[i]);  // vectorizes
  int64_t at = r.begin;
  while (file->data()[at] != mx) ++at;
  if (mx >= vocab_size)
    throw UserError(SourceLoc{path}, "holds byte " + std::to_string(mx) + " at offset " + std::to_string(at) +
                                         " but model.vocab_size is " + std::to_string(vocab_size) +
                                         " (the byte tokenizer maps each byte to its value)",
                    "set model.vocab_size to 256 for text data");
  return std::make_unique<TextSource>(path, r, T, std::move(file), mx);
}

std::unique_ptr<WindowSource> open_bin(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                       int64_t T, int64_t vocab_size) {
  auto file = std::make_unique<MappedFile>(path);
  const int64_t size = file->size();
  const unsigned char* base = file->data();
  const bool llmc = size >= 4 && load_i32le(base) == kLlmcMagic;
  int64_t offset = 0, n = 0;
  if (llmc) {
    if (size < kLlmcHeaderBytes)
      throw UserError(SourceLoc{path}, "truncated llm.c header: file holds " + std::to_string(size) +
                                           " bytes, the header alone is " + std::to_string(kLlmcHeaderBytes),
                      "re-export the file (llm.c dev/data scripts)");
    const int32_t version = load_i32le(base + 4), declared = load_i32le(base + 8);
    if (version != kLlmcVersion)
      throw UserError(SourceLoc{path}, "llm.c token file version " + std::to_string(version) +
                                           " is not supported (expected version 1: uint16 tokens)",
                      "export GPT-2-style uint16 tokens (version 1)");
    offset = kLlmcHeaderBytes;
    const int64_t held = (size - kLlmcHeaderBytes) / 2;
    if (declared < 0 || held < declared)
      throw UserError(SourceLoc{path}, "truncated: header says " + std::to_string(declared) + " tokens, file holds " +
                                           std::to_string(held),
                      "the file was cut short (interrupted download or copy?): fetch or export it again");
    if (held > declared || (size - kLlmcHeaderBytes) % 2 != 0)
      throw UserError(SourceLoc{path}, "header says " + std::to_string(declared) + " tokens, but the file holds " +
                                           std::to_string(size - kLlmcHeaderBytes) + " bytes after the header",
                      "the file is not a valid llm.c token file: export it again");
    n = declared;
  } else {
    if (size % 2 != 0)
      throw UserError(SourceLoc{path}, "size " + std::to_string(size) + " bytes is odd: not a uint16 token file",
                      "kind bin expects raw uint16 tokens (nanoGPT) or an llm.c file (magic 20240520)");
    n = size / 2;
  }
  const SplitRange r = split_range(n, cfg, split, whole);
  check_split_length(path, n, r, split, whole, T);
  uint16_t mx = 0;
  for (int64_t i = r.begin; i < r.end; ++i) mx = std::max(mx, load_u16le(base + offset + 2 * i));  // vectorizes
  int64_t at = r.begin;
  while (load_u16le(base + offset + 2 * at) != mx) ++at;
  if (mx >= vocab_size)
    throw UserError(SourceLoc{path}, "holds token " + std::to_string(mx) + " (at token " + std::to_string(at) +
                                         ") but model.vocab_size is " + std::to_string(vocab_size),
                    token_range_hint(mx));
  return std::make_unique<BinSource>(path, r, T, std::move(file), offset, n, llmc, mx);
}

}  // namespace runner::data_detail
