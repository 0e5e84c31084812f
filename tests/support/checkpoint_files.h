// Reading a checkpoint file's tensors back as bytes, for the tests that require two runs to
// end bit for bit alike (resume after SIGKILL or SIGTERM, in fp32 and in 16 bits). Design: the
// file is read with HDF5 directly, not through runner/checkpoint/, so a bug in the reader
// cannot hide one in the writer.
#pragma once
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace test_support {

// Every dataset under /params and /optimizer of `file` ("/params/wte.weight" -> its raw bytes
// and the size of its stored HDF5 type).
std::map<std::string, std::pair<std::vector<char>, size_t>> checkpoint_datasets(const std::filesystem::path& file);

// CHECKs that files `a` and `b` hold the same datasets (more than 10), byte for byte, naming
// any that differs; returns a's (for checks of the caller's own on them).
std::map<std::string, std::pair<std::vector<char>, size_t>> check_same_datasets(const std::filesystem::path& a,
                                                                                const std::filesystem::path& b);

}  // namespace test_support
