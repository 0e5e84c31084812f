// Reading a prepared dataset back as the trainer does: one split's whole token stream.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runner/data/data.h"

namespace test_support {

// Every token of `split` in order, through the training source with T = 1 windows (each
// sample's input, then the last sample's target), so a test compares what training reads.
std::vector<int32_t> token_stream(const std::string& dir, runner::Split split, int64_t vocab,
                                  runner::DataKind kind = runner::DataKind::hdf5);

}  // namespace test_support
