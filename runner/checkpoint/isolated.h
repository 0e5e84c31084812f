// Reading a checkpoint in another process: a corrupt file that crashes libhdf5 (a signal inside
// its metadata code; the soak found a double free on a flipped byte, in the group iteration
// format-1 files still need) is then reported as a corrupt checkpoint instead of taking the
// reader down. One helper for both readers that need it: the verification that chooses the
// checkpoint a resume continues from (resume.h) and `runner inspect`.
//
// Design: the child sends one record through a pipe, in one format for both readers: 'O'
// (verified, or inspect's verdict OK) or 'B' (inspect's verdict BAD), each followed by the
// report (empty for a verification), or 'E' followed by a UserError's problem, a NUL and its
// fix. A child that ends without a well-formed record crashed, and the parent says so. Without
// MPI the child is a fork. Under MPI a fork of a rank is unsafe (Open MPI's registered memory,
// its progress threads), so a verification starts the runner binary's hidden
// `__verify-checkpoint FILE` instead (posix_spawn, without the launcher's variables), which
// prints the same record. Where no child can be started, the read runs in-process.
#pragma once
#include <string>

namespace runner {

// verify_checkpoint_file(path) in a child process. Throws the child's UserError, or one saying
// that the file crashed the reader (a file that crashes HDF5 is one that does not verify).
void verify_checkpoint_isolated(const std::string& path);

// `runner inspect`: inspect_checkpoint (checkpoint.h) in a forked child, so that a file that
// crashes the HDF5 library is reported as a corrupt checkpoint (UserError naming the signal).
std::string inspect_checkpoint_isolated(const std::string& path, bool* ok = nullptr);

// The runner binary, whose hidden command `__verify-checkpoint FILE` prints verify_record(FILE):
// the verifier under MPI. The runner's main sets it; without it (a test binary under mpirun)
// verification under MPI stays in-process.
void set_checkpoint_verifier(const std::string& exe);
// The record a verifying child sends: "O", or "E" problem NUL fix.
std::string verify_record(const std::string& path);

}  // namespace runner
