// The one way runner code talks to the HDF5 C library: its lock, its handles, its error text,
// and the mapping between our dtypes and HDF5's types. Used by the checkpoint files
// (runner/checkpoint/) and the HDF5 token reader (runner/data/hdf5_tokens.cpp).
//
// THE LOCKING RULE. The HDF5 library on this system is built without thread safety, and the
// process has several threads that use it (data loader workers streaming token windows, the
// asynchronous checkpoint writer, the training thread). So:
//   every HDF5 call is made while this thread holds an h5::Lock.
// - h5::Lock is one process-wide mutex (h5::mutex(), which tests also lock around raw HDF5
//   calls of their own), re-entrant within a thread: a helper can take it
//   without knowing whether its caller already does.
// - h5::Id (a handle that closes itself) takes the lock when it closes, so a handle may be
//   destroyed anywhere: at the end of a scope, during unwinding, on another thread's lock-free
//   path. Code never has to arrange to destroy handles "with the lock held".
// - The outermost Lock of a thread turns off HDF5's automatic printing of its error stack for
//   as long as it is held: a failing call is reported through error_text() (read it right
//   after the call, under the same lock) inside our own message, never as a stack dump on
//   stderr.
// - Hold it briefly where other threads wait: per slab of a tensor, per window of tokens; not
//   across a whole file, except at start-up and resume (nothing else runs then).
// Never lock h5::mutex() directly in runner code: a thread holding it directly
// and then taking an h5::Lock deadlocks.
#pragma once
#include <hdf5.h>

#include <mutex>
#include <string>

#include "ops/tensor.h"

namespace runner::h5 {

// The process-wide mutex under every Lock. Runner code takes a Lock instead; tests lock it
// around raw HDF5 calls of their own and check that nothing is left holding it.
std::mutex& mutex();

class Lock {
 public:
  Lock();
  ~Lock();
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;  // the automatic error printer of the outermost lock, restored on release
  void* data_ = nullptr;
  bool outermost_ = false;
};

// An HDF5 identifier that closes itself (with its own close function: H5Fclose, H5Dclose, ...).
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer close) : id_(id), close_(close) {}
  Id(Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now (under the lock) and reports whether closing succeeded: a file's close flushes
  // it. Closing an empty handle succeeds.
  bool close();
  void reset() { close(); }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// The most specific messages on HDF5's error stack ("no detail from HDF5" when it is empty),
// then clears the stack. Call with the lock held, right after the failing call.
std::string error_text();

// Discards whatever HDF5's error stack holds (a probe that was allowed to fail). Lock held.
void clear_errors();

// The little-endian file type a tensor of dtype `t` is stored as: its own type, and uint16 for
// the 16-bit floats (which say what they are in a dtype attribute). Lock held (the H5T_*
// macros may initialise the library).
hid_t file_type(ops::DType t);

// A short description of an HDF5 type: "float32", "uint64", "float32be", "str[79]", "vlen-str",
// "compound", ... Lock held.
std::string describe_type(hid_t type);

// A fixed-length string type of `n` bytes (at least 1), NUL-padded, in character set `cset`.
Id string_type(size_t n, H5T_cset_t cset);

// Creates the scalar attribute `name` of `obj` with file type `type` and writes `value` (held in
// memory as `type` too). False when either fails. Lock held.
bool write_attr(hid_t obj, const char* name, hid_t type, const void* value);

}  // namespace runner::h5
