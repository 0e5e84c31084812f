// Creating a checkpoint's HDF5 objects, for both writers (see file_writer.h). The order of the
// calls here, and of the objects (write_layout), decides the file's bytes: keep it.
#include "runner/checkpoint/file_writer.h"

#include <fmt/format.h>

#include <stdexcept>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"

namespace runner::ckpt {

FileWriter::FileWriter(std::string path, void* mpi_comm, bool write_small)
    : path_(std::move(path)), write_small_(write_small) {
  h5::Lock l;
  h5::Id fcpl = file_create_plist();
  h5::Id fapl = file_access_plist(mpi_comm);
  file_ = h5::Id(H5Fcreate(path_.c_str(), H5F_ACC_EXCL, fcpl, fapl), H5Fclose);
  if (!file_.ok()) fail("cannot create");
  gcpl_ = group_create_plist();
  dcpl_ = dataset_create_plist();
}

void FileWriter::group(const std::string& p) {
  h5::Lock l;
  h5::Id g(H5Gcreate2(file_, p.c_str(), H5P_DEFAULT, gcpl_, H5P_DEFAULT), H5Gclose);
  if (!g.ok()) fail("cannot create group " + p + " in");
}

void FileWriter::state(const StateScalars& s) {
  h5::Lock l;
  h5::Id gcpl = state_group_create_plist(gcpl_);
  h5::Id g(H5Gcreate2(file_, kStatePath, H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
  if (!g.ok()) fail(std::string("cannot create ") + kStatePath + " in");
  struct Put {
    FileWriter* w;
    hid_t g;
    void operator()(const char* n, int64_t v) const { w->attr_i64(g, n, v); }
    void operator()(const char* n, double v) const { w->attr_f64(g, n, v); }
    void operator()(const char* n, const std::string& v) const { w->attr_str(g, n, v); }
  };
  for_each_state_field(s, Put{this, g});
  attr_u32(g, kCrcAttr, state_crc(s));
  if (s.omp_threads > 0) attr_i64(g, kThreadsAttr, s.omp_threads);
}

void FileWriter::u64_array(const std::string& p, const std::vector<uint64_t>& v, const char* fields) {
  h5::Lock l;
  hsize_t n = v.size();
  h5::Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  h5::Id ds(H5Dcreate2(file_, p.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
  if (!ds.ok() || (write_small_ && H5Dwrite(ds, H5T_STD_U64LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0))
    fail("cannot write " + p + " in");
  attr_str(ds, kFieldsAttr, fields);
  attr_u32(ds, kCrcAttr, crc32c(0, v.data(), v.size() * 8));
}

// A fixed-length string (NUL-padded), so h5dump prints it and its bytes are contiguous.
void FileWriter::text(const std::string& p, const std::string& s) {
  h5::Lock l;
  std::string stored = s.empty() ? std::string(1, '\0') : s;
  h5::Id type = h5::string_type(stored.size(), H5T_CSET_UTF8);
  h5::Id space(H5Screate(H5S_SCALAR), H5Sclose);
  h5::Id ds(H5Dcreate2(file_, p.c_str(), type, space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
  if (!ds.ok() || (write_small_ && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data()) < 0))
    fail("cannot write " + p + " in");
  attr_u32(ds, kCrcAttr, crc32c(0, stored.data(), stored.size()));
}

h5::Id FileWriter::create_tensor(const std::string& p, const std::vector<int64_t>& shape, ops::DType stored) {
  h5::Lock l;
  const int rank = static_cast<int>(shape.size());
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Id space(rank ? H5Screate_simple(rank, dims.data(), nullptr) : H5Screate(H5S_SCALAR), H5Sclose);
  h5::Id ds(H5Dcreate2(file_, p.c_str(), h5::file_type(stored), space, H5P_DEFAULT, dcpl_, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) fail("cannot create dataset " + p + " in");
  attr_str(ds, kDtypeAttr, ops::dtype_name(stored));
  return ds;
}

void FileWriter::attr_crc(hid_t ds, uint32_t crc) {
  h5::Lock l;
  attr_u32(ds, kCrcAttr, crc);
}

void FileWriter::flush() {
  h5::Lock l;
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail("cannot flush");
}

void FileWriter::close() {
  flush();
  fault_check_stage(WriteFault::BeforeClose);
  gcpl_.reset();
  dcpl_.reset();
  h5::Lock l;
  if (!file_.close()) fail("cannot close");
}

void FileWriter::fail(const std::string& what) const {
  throw std::runtime_error(fmt::format("checkpoint: {} {} ({})", what, path_, h5::error_text()));
}

void FileWriter::attr_str(hid_t o, const char* n, const std::string& v) {
  std::string s = v.empty() ? std::string(1, '\0') : v;
  h5::Id t = h5::string_type(s.size(), H5T_CSET_UTF8);
  if (!h5::write_attr(o, n, t, s.data())) fail(std::string("cannot write attribute ") + n + " in");
}
void FileWriter::attr_i64(hid_t o, const char* n, int64_t v) {
  if (!h5::write_attr(o, n, H5T_STD_I64LE, &v)) fail(std::string("cannot write attribute ") + n + " in");
}
void FileWriter::attr_f64(hid_t o, const char* n, double v) {
  if (!h5::write_attr(o, n, H5T_IEEE_F64LE, &v)) fail(std::string("cannot write attribute ") + n + " in");
}
void FileWriter::attr_u32(hid_t o, const char* n, uint32_t v) {
  if (!h5::write_attr(o, n, H5T_STD_U32LE, &v)) fail(std::string("cannot write attribute ") + n + " in");
}

void write_layout(FileWriter& w, const FileHeader& h, const std::vector<std::string>& names,
                  const std::function<void(const LayoutEntry&)>& tensor) {
  const std::vector<LayoutEntry> layout = checkpoint_layout(static_cast<int>(h.rng.size()), names);
  for (const LayoutEntry& e : layout) {
    switch (e.kind) {
      case LayoutEntry::Group: w.group(e.path); break;
      case LayoutEntry::State: w.state(h.state); break;
      case LayoutEntry::Recipe: w.text(e.path, h.recipe); break;
      case LayoutEntry::Names: w.text(e.path, names_text(layout)); break;
      case LayoutEntry::Rng: {
        const auto& v = h.rng[static_cast<size_t>(e.rank)];
        w.u64_array(e.path, {v.begin(), v.end()}, kRngFields);
        break;
      }
      case LayoutEntry::Data: {
        const auto& v = h.data[static_cast<size_t>(e.rank)];
        w.u64_array(e.path, {v.begin(), v.end()}, kDataFields);
        break;
      }
      case LayoutEntry::Tensor: tensor(e); break;
    }
  }
}

}  // namespace runner::ckpt
