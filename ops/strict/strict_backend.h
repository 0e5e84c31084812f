// The strict CPU device (`hardware.device: cpu-strict`): a checking device that behaves like a
// GPU while running the CPU backend's kernels, so that everything but the kernels' arithmetic
// of the GPU path is proven on a machine without one.
//
//  - Its memory cannot be touched by host code. Tensors live in an arena mapped twice from one
//    memfd: the addresses tensors hold (and host code sees) are a PROT_NONE mapping, so any
//    host read or write of tensor memory faults at the line that made it; the kernels get the
//    same bytes through a second, read-write mapping the backend translates every pointer to.
//    A host pointer passed to a kernel is refused (std::logic_error), as a GPU would fault.
//  - Its kernels run asynchronously, in order, on the device's own queue (one thread), like a
//    CUDA stream. copy_out's destination holds a poison pattern (NaN as fp32, 0xFF bytes)
//    until synchronize(), so a value read before waiting for it is wrong, never right by luck.
//  - Results are bit-identical to the CPU backend's: the same kernels, the same thread count.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/backend.h"

namespace ops::strict {

// The strict device (created on first use; its arena is reserved, not committed: pages are
// used as tensors touch them). RUNNER_STRICT_ARENA_GIB caps the arena (default: host memory).
Backend& strict_backend();

// Whether `p` points into the strict device's memory (false before the device exists).
bool is_device_pointer(const void* p);

// Counters for tests: calls queued so far, and bytes of device memory in use.
struct StrictStats {
  int64_t queued = 0;
  int64_t copies_in = 0, copies_out = 0;
  size_t bytes_in_use = 0, arena_top = 0;
};
StrictStats strict_stats();

}  // namespace ops::strict
