// Pieces shared by the checkpoint's .cpp files; not part of the public API (checkpoint.h).
//
// - sizes of the bounded pieces everything is written and read in;
// - fault injection checks (the hooks' state lives in publish.cpp);
// - the end of the atomic protocol (publish), shared by both writers;
// - bf16 conversion of stored optimizer moments.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "runner/checkpoint/checkpoint.h"

namespace runner::ckpt {

constexpr size_t kSlabBytes = 16u << 20;       // write granularity (the HDF5 lock is held per slab)
constexpr size_t kReadChunkBytes = 16u << 20;  // pread granularity when verifying and loading

// "checkpoint: WHAT PATH: strerror(errno)".
std::string sys_error(const std::string& what, const std::string& path);

// Throw CheckpointFault (or _exit(137), see checkpoint.h) when the injected fault is due.
void fault_check_bytes(int64_t tensor_bytes_written);
void fault_check_stage(WriteFault stage);

// The temporary a save writes before publishing it: DIR/.NAME.tmp.PID.
std::string temp_path(const std::string& dir, const std::string& name, int64_t pid);

// The end of the atomic protocol, shared by the serial and the collective writer: verify the
// finished temporary, fsync it, rename it to dir/name, fsync the directory, then (latest) point
// LATEST at it the same way. *renamed says whether the rename happened before a throw (until
// then the caller owns the temporary and removes it).
void publish(const std::string& tmp, const std::string& dir, const std::string& name, bool latest, bool* renamed);

// bf16 as stored: the upper half of the fp32 bits, rounded to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace runner::ckpt
