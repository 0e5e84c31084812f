// The HDF5 helper: the process-wide re-entrant lock, self-closing handles, error text, types.
// The rule they implement is written once, in hdf5.h.
#include "runner/hdf5/hdf5.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>


namespace runner::h5 {

namespace {
// How many Locks this thread holds (the lock is re-entrant per thread).
thread_local int t_depth = 0;
}  // namespace

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

Lock::Lock() {
  if (t_depth++ == 0) {
    mutex().lock();
    outermost_ = true;
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
}

Lock::~Lock() {
  if (--t_depth == 0) {
    H5Eset_auto2(H5E_DEFAULT, func_, data_);
    mutex().unlock();
  }
}

bool Id::close() {
  bool good = true;
  if (id_ >= 0) {
    Lock l;
    good = close_(id_) >= 0;
  }
  id_ = -1;
  return good;
}

std::string error_text() {
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

void clear_errors() { H5Eclear2(H5E_DEFAULT); }

hid_t file_type(ops::DType t) {
  switch (t) {
    case ops::DType::F32: return H5T_IEEE_F32LE;
    case ops::DType::F64: return H5T_IEEE_F64LE;
    case ops::DType::I32: return H5T_STD_I32LE;
    case ops::DType::BF16:
    case ops::DType::F16:
    case ops::DType::U16: return H5T_STD_U16LE;
    case ops::DType::U8: return H5T_STD_U8LE;
    case ops::DType::I8: return H5T_STD_I8LE;
  }
  return H5T_IEEE_F32LE;
}

std::string describe_type(hid_t t) {
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

Id string_type(size_t n, H5T_cset_t cset) {
  Lock l;
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, std::max<size_t>(n, 1));
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  if (cset != H5T_CSET_ASCII) H5Tset_cset(t, cset);  // ASCII is H5T_C_S1's own
  return t;
}

bool write_attr(hid_t obj, const char* name, hid_t type, const void* value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Awrite(a, type, value) >= 0;
}

}  // namespace runner::h5

namespace runner {
void disable_hdf5_exit_cleanup() { H5dont_atexit(); }  // declared in runner/checkpoint/checkpoint.h
}  // namespace runner
