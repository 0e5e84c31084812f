// Reading a checkpoint's tensors back with HDF5 (checkpoint_files.h).
#include "tests/support/checkpoint_files.h"

#include <doctest/doctest.h>
#include <hdf5.h>

namespace test_support {

std::map<std::string, std::pair<std::vector<char>, size_t>> checkpoint_datasets(const std::filesystem::path& file) {
  std::map<std::string, std::pair<std::vector<char>, size_t>> out;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  struct Ctx { std::string prefix; std::map<std::string, std::pair<std::vector<char>, size_t>>* out; };
  auto visit = [](hid_t obj, const char* name, const H5O_info_t* info, void* op) -> herr_t {
    auto* c = static_cast<Ctx*>(op);
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    hid_t s = H5Dget_space(d);
    size_t n = static_cast<size_t>(H5Sget_simple_extent_npoints(s)) * H5Tget_size(t);
    std::vector<char> buf(n);
    H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    (*c->out)[c->prefix + name] = {std::move(buf), H5Tget_size(t)};
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    return 0;
  };
  for (const char* g : {"/params", "/optimizer"}) {
    Ctx c{std::string(g) + "/", &out};
    hid_t grp = H5Gopen2(f, g, H5P_DEFAULT);
    REQUIRE(grp >= 0);
    H5Ovisit(grp, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &c);
    H5Gclose(grp);
  }
  H5Fclose(f);
  return out;
}

std::map<std::string, std::pair<std::vector<char>, size_t>> check_same_datasets(const std::filesystem::path& a,
                                                                                const std::filesystem::path& b) {
  auto ta = checkpoint_datasets(a), tb = checkpoint_datasets(b);
  REQUIRE(ta.size() > 10);
  REQUIRE(ta.size() == tb.size());
  for (auto& [name, t] : ta) {
    CAPTURE(name);
    REQUIRE(tb.count(name));
    CHECK(t.first == tb[name].first);
  }
  return ta;
}

}  // namespace test_support
