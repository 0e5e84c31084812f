// FileReader: a checkpoint opened as untrusted input. HDF5 is asked for metadata only; each
// dataset must be contiguous with storage = shape x type size inside the file, and its bytes are
// then read with pread in bounded pieces and checksummed. A file from elsewhere can claim any
// shape or size; nothing is allocated from its claims. Every problem is a UserError located at
// the file (docs/checkpoint-format.md, "What loading checks").
//
// Also the two walks that verify a whole file (scan, structure_problems), shared by
// verify_checkpoint_file and `runner inspect`.
//
// Internal to runner/checkpoint/. Methods take the HDF5 lock for their metadata calls; read()
// does not need it (pread).
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"

namespace runner::ckpt {

inline constexpr const char* kCorruptFix =
    "the file is damaged or was not written by runner; use an older checkpoint or start over";

// Throws UserError(loc = path) "what; fix".
[[noreturn]] void bad(const std::string& path, const std::string& what, const std::string& fix = "");

// What a dataset's metadata claims, and whether its bytes can be read (problem).
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
  // Opens `path` read-only; throws UserError for a missing, empty, non-HDF5 or truncated file.
  explicit FileReader(std::string path);
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }

  // Whether every component of an absolute path exists as a link.
  bool exists(const std::string& p) const;
  // /state's scalars, their checksum verified, the format version accepted.
  StateScalars state() const;
  // Metadata of one dataset; throws when it is missing or not a dataset. Never reads data.
  DsInfo info(const std::string& p) const;
  // Every dataset of the checkpoint: format 2 lists them in /names (read by name, checksummed,
  // each path checked); format 1 has no /names, and its groups are iterated (H5Lvisit, the
  // part of HDF5 a damaged file can crash: callers that cannot afford a crash run in a child
  // process). Throws when /names is needed and missing or damaged.
  std::vector<std::string> list_datasets() const;
  // Names of the datasets directly in a group ([] when there are none): from /names, or by
  // iterating the group in a format-1 file. Throws as list_datasets does.
  std::vector<std::string> members(const std::string& group) const;
  // Whether the datasets are listed by /names (false: a format-1 file, iterated). Throws as
  // list_datasets does.
  bool listed_by_names() const { return names() != nullptr; }
  // Checks a dataset against what the state expects: type (exactly), shape, storage. Throws.
  void expect(const DsInfo& d, const std::vector<int64_t>& shape, ops::DType stored, const char* role) const;
  // Throws unless the dataset's bytes can be read: contiguous, storage = shape x type size,
  // inside the file, checksum present.
  void check_storage(const DsInfo& d) const;

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

  // Small datasets, read whole and checked: an uint64[n] array, a fixed-length string scalar.
  std::vector<uint64_t> u64_array(const std::string& p, size_t n) const;
  std::string text(const std::string& p) const;

 private:
  std::vector<char> read_small(const DsInfo& d) const;
  // /names, parsed and checked (read once); nullptr for a format-1 file. Throws.
  const std::vector<std::string>* names() const;
  // The format_version attribute of /state alone (0 when it cannot be read).
  int64_t format_hint() const;
  // Checks the superblock (what HDF5 reads first) before HDF5 opens the file: the signature at
  // byte 0, a version-2/3 superblock with 8-byte addresses, base address 0, its checksum, and an
  // end-of-file address within the file (else: truncated). Throws.
  void check_superblock() const;
  DsInfo describe(hid_t ds, const std::string& p) const;  // lock held
  // Attributes: exist, scalar, of the right class; converted to the native type by HDF5.
  h5::Id open_attr(hid_t obj, const std::string& where, const char* name, H5T_class_t cls) const;
  int64_t attr_i64(hid_t obj, const std::string& where, const char* name) const;
  double attr_f64(hid_t obj, const std::string& where, const char* name) const;
  std::string attr_str(hid_t obj, const std::string& where, const char* name) const;
  // The class, byte order and size of dataset p's type are exactly `type`'s.
  bool type_is(const std::string& p, hid_t type) const;

  struct Fd {  // closes itself, also when the constructor throws
    int fd = -1;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  };
  std::string path_;
  Fd fd_;
  uint64_t file_size_ = 0;
  h5::Id file_;  // closed before fd_
  enum class Names { Unread, Listed, Iterate, Broken };
  mutable Names names_mode_ = Names::Unread;
  mutable std::vector<std::string> names_;
  mutable std::string names_problem_;
};

// Every dataset's metadata (under the lock) and then its bytes, checksummed (without it).
struct ScanEntry {
  DsInfo d;
  std::optional<uint32_t> computed;  // set when the bytes were read
  std::string problem;               // empty: verified
};
std::vector<ScanEntry> scan(const FileReader& rd);

// What a checkpoint must hold besides checksummed bytes: /recipe, at least one rank's /rng and
// /data, and an optimizer tree that mirrors /params name for name.
std::vector<std::string> structure_problems(const FileReader& rd);

}  // namespace runner::ckpt
