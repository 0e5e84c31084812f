// Shared by the tests that run the real binary under mpirun (test_parallel, test_parallel_ckpt):
// the small layout-test model, a shell runner that captures output, and the mpirun prefix.
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace mpirun_util {

// A 2-layer GPT with dropout 0.1 and a vocabulary of 63 that tensor parallelism must pad,
// learning 2-digit addition; global batch 8 of micro-batches of 2, 10 steps, checkpoints at 5.
inline const char* kLayoutRecipe = R"(name: layout
model:
  family: gpt
  vocab_size: 63
  seq_len: 32
  d_model: 64
  n_layers: 2
  n_heads: 4
  norm: layernorm
  activation: gelu
  position: learned
  tie_embeddings: true
  dropout: 0.1
data:
  kind: addition
  digits: 2
batch:
  global: 8
  micro: 2
optimizer:
  lr: 3.0e-3
  weight_decay: 0.1
  grad_clip: 1.0
  schedule:
    kind: cosine
    warmup_steps: 2
train:
  steps: 10
  log_every: 5
  eval_every: 5
  eval_batches: 2
  threads: 1
checkpoint:
  cadence: steps
  every_steps: 5
  keep_last: 5
hardware:
  device: cpu
)";

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

inline Result sh(const std::string& cmd) {
  Result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// "mpiexec -np N ..." with one OpenMP thread per rank (the ctest environment allows root and
// oversubscription); a 300 s timeout so a hang fails the test instead of CI.
inline std::string mpirun(int np) {
  return std::string("timeout 300 ") + RUNNER_MPIEXEC + " -np " + std::to_string(np) + " --oversubscribe -x OMP_NUM_THREADS=1 ";
}

// A scratch directory <tmp>/runner_test_<name>_<pid> for one test binary, removed when the
// binary exits unless RUNNER_KEEP_TEST_DIRS is set (to look at what a failing test left).
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("runner_test_" + name + "_" + std::to_string(::getpid()))) {}
  ~ScratchDir() {
    std::error_code ec;
    if (!std::getenv("RUNNER_KEEP_TEST_DIRS")) std::filesystem::remove_all(path, ec);
  }
};

// A whole file as bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace mpirun_util
