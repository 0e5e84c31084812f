// FileWriter: creates a checkpoint file's objects (groups, /state, the small datasets, empty
// tensor datasets) with the layout's properties, and write_layout(), the one walk over
// checkpoint_layout() that both writers make. What goes into the tensor datasets is each
// writer's business: the serial writer fills each one right after creating it
// (write_serial.cpp); the collective writer creates them all, then every rank writes its
// slices (write_collective.cpp).
//
// Internal to runner/checkpoint/. Each method takes the HDF5 lock for itself (hdf5.h).
#pragma once
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "ops/tensor.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/hdf5/hdf5.h"

namespace runner::ckpt {

class FileWriter {
 public:
  // Creates `path` (it must not exist). Serially by default. Collectively when `mpi_comm`
  // points to an MPI_Comm: every rank of it constructs the same FileWriter and makes the same
  // calls with the same arguments (parallel HDF5 over MPI-IO); the small datasets' bytes are
  // then written by the rank given `write_small` only.
  explicit FileWriter(std::string path, void* mpi_comm = nullptr, bool write_small = true);

  void group(const std::string& p);
  void state(const StateScalars& s);  // /state: its attributes, then their crc32c
  void u64_array(const std::string& p, const std::vector<uint64_t>& v, const char* fields);
  void text(const std::string& p, const std::string& s);  // fixed-length string scalar, NUL-padded
  // An empty tensor dataset stored as `stored` (contiguous, allocated now) with its dtype
  // attribute; the caller writes its bytes, then its checksum (attr_crc).
  h5::Id create_tensor(const std::string& p, const std::vector<int64_t>& shape, ops::DType stored);
  void attr_crc(hid_t ds, uint32_t crc);
  void flush();  // H5Fflush, global scope
  // Flushes, then (after the BeforeClose fault point) closes the file.
  void close();

  hid_t file() const { return file_.get(); }
  const std::string& path() const { return path_; }
  // Throws std::runtime_error "checkpoint: WHAT PATH (HDF5's error text)". Lock held.
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void attr_str(hid_t obj, const char* name, const std::string& v);
  void attr_i64(hid_t obj, const char* name, int64_t v);
  void attr_f64(hid_t obj, const char* name, double v);
  void attr_u32(hid_t obj, const char* name, uint32_t v);

  std::string path_;
  bool write_small_ = true;
  h5::Id file_, gcpl_, dcpl_;
};

// The values of everything in a checkpoint but its tensors.
struct FileHeader {
  StateScalars state;
  std::string recipe;
  std::vector<std::array<uint64_t, kRngWords>> rng;    // one entry per rank of the writing job
  std::vector<std::array<uint64_t, kDataWords>> data;  // as many as rng
};

// Creates the objects of checkpoint_layout(h.rng.size(), names) in its order, handing each
// tensor entry to `tensor` (which creates that dataset, and may write it).
void write_layout(FileWriter& w, const FileHeader& h, const std::vector<std::string>& names,
                  const std::function<void(const LayoutEntry&)>& tensor);

}  // namespace runner::ckpt
