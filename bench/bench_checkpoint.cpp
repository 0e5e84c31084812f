// Checkpoint stall: how long a save blocks training, sync against async, side by side.
//
// Usage: bench_checkpoint [MILLION_PARAMS=50] [DIR=/tmp/bench_checkpoint.<pid>] [SAVES=3]
// A GPT-shaped fp32 state (C=1024 layers of qkv, proj, fc, fc2 plus norms) with both Adam
// moments, about 12 bytes per parameter (600 MB at 50M). Sync: the stall is the whole atomic
// write (HDF5 write, verify, fsync, rename, LATEST). Async: the stall is the host snapshot;
// the write runs on a background thread and its time is reported beside it. The first save
// of each mode also pays for first-touch allocation, so saves are repeated.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "ops/rng.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/saver.h"

using namespace runner;

namespace {

TrainState make_state(double million_params) {
  const int64_t C = 1024;
  const int64_t per_layer = 12 * C * C + 2 * C;
  const int64_t L = std::max<int64_t>(1, static_cast<int64_t>(million_params * 1e6 / per_layer + 0.5));
  TrainState s;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    s.params.names.push_back(name);
    s.params.decay.push_back(shape.size() > 1);
    for (auto* v : {&s.params.values, &s.adam_m, &s.adam_v}) {
      ops::Tensor t = ops::Tensor::empty(shape, ops::DType::F32,
                                         v == &s.params.values ? ops::Account::Parameters : ops::Account::Optimizer);
      uint32_t* p = t.data<uint32_t>();
      const uint64_t key = ops::hash_name(name.c_str()) ^ reinterpret_cast<uintptr_t>(v);
#pragma omp parallel for
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = ops::rng_u32(key, static_cast<uint64_t>(i)) & 0xbfffffffu;
      v->push_back(std::move(t));
    }
  };
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "attn.qkv.weight", {3 * C, C});
    add(h + "attn.proj.weight", {C, C});
    add(h + "ln_2.weight", {C});
    add(h + "mlp.fc.weight", {4 * C, C});
    add(h + "mlp.proj.weight", {C, 4 * C});
  }
  s.recipe_yaml = "name: bench\n";
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const double mparams = argc > 1 ? std::atof(argv[1]) : 50.0;
  const std::string dir = argc > 2 ? argv[2] : "/tmp/bench_checkpoint." + std::to_string(::getpid());
  const int saves = argc > 3 ? std::atoi(argv[3]) : 3;

  TrainState s = make_state(mparams);
  const double params = static_cast<double>(s.params.numel());
  const double state_mb = 3 * params * 4 / 1e6;
  std::printf("state: %.1fM params in %zu tensors, %.0f MB with both Adam moments; directory %s\n", params / 1e6,
              s.params.names.size(), state_mb, dir.c_str());
  std::filesystem::create_directories(dir);

  CheckpointConfig cfg;
  cfg.keep_last = 1;
  std::printf("%-6s %-5s %12s %12s %12s %10s\n", "mode", "save", "stall ms", "write ms", "file MB", "MB/s");
  double stall_sum[2] = {0, 0}, write_sum[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    cfg.async = mode == 1;
    CheckpointSaver m(dir + (mode ? "/async" : "/sync"), cfg);
    for (int i = 0; i < saves; ++i) {
      s.step = 1 + i;
      m.save(s);
      const double stall = m.last_stall_seconds();
      // Training would run here; the async write proceeds meanwhile.
      m.wait();
      const double write = m.last_write_seconds();
      const std::string path = dir + (mode ? "/async/" : "/sync/") + checkpoint_file_name(s.step);
      const double mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
      std::printf("%-6s %-5d %12.1f %12.1f %12.1f %10.0f\n", mode ? "async" : "sync", i + 1, stall * 1e3, write * 1e3, mb,
                  mb / write);
      if (i > 0 || saves == 1) {
        stall_sum[mode] += stall;
        write_sum[mode] += write;
      }
    }
  }
  const int n = saves > 1 ? saves - 1 : 1;
  std::printf("\ntraining stall per save (mean%s):  sync %.1f ms   async %.1f ms   (%.0fx less)\n",
              saves > 1 ? " without the first" : "", stall_sum[0] / n * 1e3, stall_sum[1] / n * 1e3,
              stall_sum[1] > 0 ? stall_sum[0] / stall_sum[1] : 0.0);
  std::printf("write throughput: sync %.0f MB/s, async %.0f MB/s (state %.0f MB; includes verify + fsync)\n",
              state_mb / (write_sum[0] / n), state_mb / (write_sum[1] / n), state_mb);
  (void)now_s;
  std::filesystem::remove_all(dir);
  return 0;
}
