// Checkpoints: bit-exact round trips, atomic publication under injected crashes, corruption
// detection with fallback, retention, cadence, async == sync, signals, inspect.
//
// The state is built by hand (a few named fp32 tensors with random bits, moments, cursor,
// RNG, scaler), so these tests need no model, recipe or data. Crashes are real: a forked
// child writes with set_write_fault_exit(true) (what RUNNER_CKPT_FAULT_EXIT=1 arms in the
// runner) and dies with _exit(137) partway, leaving whatever a killed process leaves; the
// parent then checks what a resume would see.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "ops/backend.h"
#include "ops/knobs.h"
#include "ops/rng.h"
#include "ops/strict/strict_backend.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/resume.h"
#include "runner/checkpoint/saver.h"
#include "runner/checkpoint/file_layout.h"
#include "runner/errors.h"
#include "runner/hdf5/hdf5.h"
#include "runner/signals.h"
#include "tests/support/temp_dir.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

struct TempDir : test_support::TempDir {
  TempDir() : test_support::TempDir("test_checkpoint") {}
};

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

Shapes default_shapes() {
  return {{"wte.weight", {64, 32}},        {"h.0.attn.qkv.weight", {96, 32}}, {"h.0.attn.qkv.bias", {96}},
          {"h.0.ln_1.weight", {32}},       {"h.0.mlp.fc.weight", {128, 32}},  {"lnf.weight", {32}}};
}

// Where the test states live: the strict device under RUNNER_STRICT=1 (test_checkpoint_strict:
// every save, load and snapshot below then crosses to and from device memory that host code
// cannot touch), host memory otherwise.
ops::Backend* test_device() {
  return ops::knobs().strict ? &ops::strict::strict_backend() : nullptr;
}

// A tensor's bytes in host memory (a crossing for a device tensor).
std::vector<char> host_bytes_of(const ops::Tensor& t) {
  std::vector<char> out(t.nbytes());
  t.read_to_host(out.data());
  return out;
}

// Random bits, including the values a careless format would mangle (NaN payloads, -0, inf, denormals).
void fill_random(ops::Tensor& t, uint64_t key) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  float* p = host.data();
  struct Put {  // written through the crossing in, whatever the tensor's device
    ops::Tensor& t;
    const float* p;
    ~Put() { t.write_from_host(p); }
  } put{t, p};
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t bits = ops::rng_u32(key, static_cast<uint64_t>(i));
    if (i % 17 == 5) bits = 0x7fc01234u;       // NaN with a payload
    else if (i % 19 == 3) bits = 0x80000000u;  // -0
    else if (i % 23 == 7) bits = 0x00000003u;  // denormal
    else if (i % 29 == 11) bits = 0xff800000u; // -inf
    std::memcpy(p + i, &bits, 4);
  }
}

TrainState make_state(uint64_t seed, int64_t step, const Shapes& shapes = default_shapes(),
                      ops::Backend* device = test_device()) {
  TrainState s;
  using ops::Account, ops::DType;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [name, shape] = shapes[i];
    s.params.names.push_back(name);
    s.params.values.emplace_back(shape, DType::F32, Account::Parameters, false, device);
    s.params.grads.emplace_back(shape, DType::F32, Account::Gradients, true, device);
    s.params.decay.push_back(shape.size() > 1);
    s.adam_m.emplace_back(shape, DType::F32, Account::Optimizer, false, device);
    s.adam_v.emplace_back(shape, DType::F32, Account::Optimizer, false, device);
    fill_random(s.params.values.back(), ops::rng_key(seed, 1, i));
    fill_random(s.adam_m.back(), ops::rng_key(seed, 2, i));
    fill_random(s.adam_v.back(), ops::rng_key(seed, 3, i));
  }
  s.step = step;
  s.tokens = step * 4096 + static_cast<int64_t>(seed);
  s.loader = LoaderState{step * 8 + 3, seed * 7 + 1};
  s.rng = RngState{seed, seed + 1, seed + 2, seed + 3, static_cast<uint64_t>(step) * 11};
  s.scaler = LossScalerState{32768.0 + static_cast<double>(seed), step, 2};
  s.loss_ema = 2.718281828 + static_cast<double>(seed) * 1e-3;
  s.recipe_yaml = "name: tiny\nmodel:\n  d_model: 32\n  n_layers: 1\n  n_heads: 4\ntrain:\n  steps: 100\n# seed " +
                  std::to_string(seed) + "\n";
  return s;
}

bool same_bits(const ops::Tensor& a, const ops::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && host_bytes_of(a) == host_bytes_of(b);
}

// Host states for the tests whose writes happen in a forked child: the strict device's queue
// thread does not survive fork().
TrainState make_host_state(uint64_t seed, int64_t step) { return make_state(seed, step, default_shapes(), nullptr); }

void check_equal(const TrainState& a, const TrainState& b) {
  REQUIRE(a.params.values.size() == b.params.values.size());
  for (size_t i = 0; i < a.params.values.size(); ++i) {
    CHECK_MESSAGE(same_bits(a.params.values[i], b.params.values[i]), a.params.names[i]);
    CHECK_MESSAGE(same_bits(a.adam_m[i], b.adam_m[i]), "adam_m " << a.params.names[i]);
    CHECK_MESSAGE(same_bits(a.adam_v[i], b.adam_v[i]), "adam_v " << a.params.names[i]);
  }
  CHECK(a.step == b.step);
  CHECK(a.tokens == b.tokens);
  CHECK(a.loader == b.loader);
  CHECK(a.rng.init_seed == b.rng.init_seed);
  CHECK(a.rng.dropout_seed == b.rng.dropout_seed);
  CHECK(a.rng.data_seed == b.rng.data_seed);
  CHECK(a.rng.sample_seed == b.rng.sample_seed);
  CHECK(a.rng.sample_counter == b.rng.sample_counter);
  CHECK(std::memcmp(&a.scaler.scale, &b.scaler.scale, sizeof(double)) == 0);
  CHECK(a.scaler.good_steps == b.scaler.good_steps);
  CHECK(a.scaler.skipped_steps == b.scaler.skipped_steps);
  CHECK(std::memcmp(&a.loss_ema, &b.loss_ema, sizeof(double)) == 0);
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// The message of the UserError `fn` throws ("" if none).
template <class Fn>
std::string user_error(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

CheckpointConfig config(const std::string& cadence = "steps", bool async = false) {
  CheckpointConfig c;
  c.cadence = parse_enum<CheckpointCadence>(cadence).value();
  c.every_steps = 10;
  c.async = async;
  c.keep_last = 100;
  return c;
}

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

int count_temporaries(const std::string& dir) {
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name[0] == '.' && name.find(".tmp.") != std::string::npos) ++n;
  }
  return n;
}

// HDF5 file surgery for the corruption tests (single-threaded here, so no lock needed).
haddr_t dataset_offset(const std::string& file, const std::string& ds) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return off;
}

void flip_byte(const std::string& file, uint64_t offset) {
  int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char b;
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b ^= 0x40;
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

void delete_dataset(const std::string& file, const std::string& ds) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  REQUIRE(H5Ldelete(f, ds.c_str(), H5P_DEFAULT) >= 0);
  H5Fclose(f);
}

void set_state_attr(const std::string& file, const char* name, int64_t v) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t g = H5Gopen2(f, "/state", H5P_DEFAULT);  // (H5Aopen_by_name + H5Awrite fails in HDF5 1.10)
  hid_t a = H5Aopen(g, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
  H5Aclose(a);
  H5Gclose(g);
  H5Fclose(f);
}

// /names as stored (NUL padding removed).
std::string names_of(const std::string& file) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, "/names", H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t t = H5Dget_type(d);
  std::string out(H5Tget_size(t), '\0');
  REQUIRE(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

// Makes a format-2 file what a format-1 writer wrote: no /names, format_version 1, /state's
// checksum recomputed over the changed version.
void downgrade_to_format1(const std::string& file) {
  delete_dataset(file, "/names");
  set_state_attr(file, "format_version", 1);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t g = H5Gopen2(f, "/state", H5P_DEFAULT);
  ckpt::StateScalars sc;
  auto get = [&](const char* name, hid_t type, void* v) {
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    REQUIRE(a >= 0);
    REQUIRE(H5Aread(a, type, v) >= 0);
    H5Aclose(a);
  };
  for (auto [name, v] : {std::pair{"format_version", &sc.format_version}, {"step", &sc.step}, {"tokens", &sc.tokens},
                         {"good_steps", &sc.good_steps}, {"skipped_steps", &sc.skipped_steps}, {"world_size", &sc.world_size}})
    get(name, H5T_NATIVE_INT64, v);
  get("loss_ema", H5T_NATIVE_DOUBLE, &sc.loss_ema);
  get("loss_scale", H5T_NATIVE_DOUBLE, &sc.scale);
  uint32_t crc = ckpt::state_crc(sc);
  hid_t a = H5Aopen(g, "crc32c", H5P_DEFAULT);
  REQUIRE(a >= 0);
  REQUIRE(H5Awrite(a, H5T_NATIVE_UINT32, &crc) >= 0);
  H5Aclose(a);
  H5Gclose(g);
  H5Fclose(f);
}

// A dataset at the root that no runner writes (and so /names does not list).
void add_stray_dataset(const std::string& file) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hsize_t n = 4;
  hid_t sp = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, "/stray", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(d >= 0);
  H5Dclose(d);
  H5Sclose(sp);
  H5Fclose(f);
}

}  // namespace

TEST_CASE("crc32c: the standard check value, and hardware == portable") {
  CHECK(crc32c(0, "123456789", 9) == 0xE3069283u);
  CHECK(crc32c_portable(0, "123456789", 9) == 0xE3069283u);
  CHECK(crc32c(0, "", 0) == 0u);
  std::vector<unsigned char> buf(4099);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(ops::mix64(i) >> 17);
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4090}) {
      CHECK(crc32c(0, buf.data() + off, n) == crc32c_portable(0, buf.data() + off, n));
      // Chaining: crc(a+b) from crc(a) then b.
      size_t cut = n / 3;
      CHECK(crc32c(crc32c(0, buf.data() + off, cut), buf.data() + off + cut, n - cut) == crc32c(0, buf.data() + off, n));
    }
  }
}

TEST_CASE("file names") {
  CHECK(checkpoint_file_name(20) == "step_00000020.h5");
  CHECK(checkpoint_file_name(123456789) == "step_123456789.h5");
  int64_t s = -1;
  CHECK(parse_checkpoint_file_name("step_00000020.h5", &s));
  CHECK(s == 20);
  CHECK(parse_checkpoint_file_name("step_123456789.h5", &s));
  CHECK(s == 123456789);
  CHECK_FALSE(parse_checkpoint_file_name("step_.h5", &s));
  CHECK_FALSE(parse_checkpoint_file_name("step_0001.h5.tmp.3", &s));
  CHECK_FALSE(parse_checkpoint_file_name(".step_00000020.h5.tmp.77", &s));
  CHECK_FALSE(parse_checkpoint_file_name("step_00x0.h5", &s));
}

TEST_CASE("round trip is bit-exact, and LATEST names the file") {
  TempDir dir;
  TrainState a = make_state(7, 20);
  SaveResult r = write_checkpoint_atomic(dir.path, a, {});
  CHECK(r.path == dir / "step_00000020.h5");
  CHECK(r.tensor_bytes == 3 * 9376 * 4);
  CHECK(file_bytes(dir / "LATEST") == "step_00000020.h5\n");
  CHECK(read_latest(dir.path) == "step_00000020.h5");
  CHECK(count_temporaries(dir.path) == 0);

  TrainState b = make_state(99, 0);  // same shapes, other values
  load_checkpoint_file(r.path, b);
  check_equal(a, b);
  CHECK(b.recipe_yaml == a.recipe_yaml);
  CHECK(read_recipe_text(r.path) == a.recipe_yaml);
  CHECK(read_checkpoint_step(r.path) == 20);

  SUBCASE("a state without moments gets them allocated") {
    TrainState c = make_state(5, 0);
    c.adam_m.clear();
    c.adam_v.clear();
    load_checkpoint_file(r.path, c);
    check_equal(a, c);
  }
  SUBCASE("the same state writes the same bytes") {
    TempDir other;
    write_checkpoint_atomic(other.path, a, {});
    CHECK(file_bytes(r.path) == file_bytes(other / "step_00000020.h5"));
  }
}

TEST_CASE("bf16 moments: half the bytes, rounded to nearest even, parameters still exact") {
  TempDir dir;
  TrainState a = make_state(3, 5);
  WriteOptions opt;
  opt.optimizer_bf16 = true;
  SaveResult r = write_checkpoint_atomic(dir.path, a, opt);
  CHECK(r.tensor_bytes == 9376 * 4 + 2 * 9376 * 2);
  TrainState b = make_state(4, 0);
  load_checkpoint_file(r.path, b);
  for (size_t i = 0; i < a.params.values.size(); ++i) {
    CHECK(same_bits(a.params.values[i], b.params.values[i]));
    const std::vector<char> ha = host_bytes_of(a.adam_m[i]), hb = host_bytes_of(b.adam_m[i]);
    const float* m = reinterpret_cast<const float*>(ha.data());
    const float* mb = reinterpret_cast<const float*>(hb.data());
    for (int64_t k = 0; k < a.adam_m[i].numel(); ++k) {
      if (std::isnan(m[k]) || std::isinf(m[k])) {
        CHECK((std::isnan(m[k]) ? std::isnan(mb[k]) : mb[k] == m[k]));
        continue;
      }
      uint32_t x, y;
      std::memcpy(&x, &m[k], 4);
      std::memcpy(&y, &mb[k], 4);
      CHECK((y & 0xffffu) == 0);                         // a bf16 value
      CHECK(std::fabs(mb[k] - m[k]) <= std::fabs(m[k]) * (1.0f / 256) + 1e-38f);  // 8 mantissa bits; denormals flush
    }
  }
  CHECK(inspect_checkpoint(r.path).find("bf16") != std::string::npos);
}

TEST_CASE("async saves produce the same file as sync saves, and return before the write") {
  TempDir d_sync, d_async;
  TrainState s = make_state(11, 10);
  {
    CheckpointSaver sync(d_sync.path, config("steps", false));
    sync.save(s);
    CHECK(sync.saves_completed() == 1);
  }
  {
    CheckpointSaver async(d_async.path, config("steps", true));
    TrainState live = make_state(11, 10);
    async.save(live);
    fill_random(live.params.values[0], 12345);  // training continues: the snapshot must not see this
    live.step = 11;
    async.wait();
    CHECK(async.saves_completed() == 1);
    CHECK(async.last_stall_seconds() >= 0);
  }
  const std::string name = "step_00000010.h5";
  CHECK(file_bytes(d_sync / name) == file_bytes(d_async / name));
  // And dataset by dataset, as loaded.
  TrainState a = make_state(0, 0), b = make_state(1, 0);
  load_checkpoint_file(d_sync / name, a);
  load_checkpoint_file(d_async / name, b);
  check_equal(a, b);
  check_equal(a, s);
}

TEST_CASE("an error in the background write fails the next save, wait or poll") {
  TempDir dir;
  CheckpointSaver m(dir.path, config("steps", true));
  TrainState s10 = make_state(1, 10);
  m.save(s10);
  m.wait();
  set_write_fault_after_bytes(1000);
  TrainState s20 = make_state(1, 20);
  m.save(s20);  // returns: the fault happens on the writer thread
  // Surfaced as the run reports it: a UserError naming the directory and the cause.
  const std::string failed = user_error([&] { m.wait(); });
  CHECK(failed.find("cannot write a checkpoint: injected checkpoint write fault") != std::string::npos);
  CHECK(failed.find(dir.path) != std::string::npos);
  set_write_fault_after_bytes(-1);
  m.wait();  // reported once
  CHECK(read_latest(dir.path) == "step_00000010.h5");
  CHECK(count_temporaries(dir.path) == 0);  // a throwing writer removes its temporary

  set_write_fault_after_bytes(0);  // stays armed until the failure has been observed
  TrainState s30 = make_state(1, 30);
  m.save(s30);
  TrainState s40 = make_state(1, 40);
  CHECK(user_error([&] { m.save(s40); }).find("injected checkpoint write fault") != std::string::npos);  // at the next save

  TrainState s50 = make_state(1, 50);
  m.save(s50);
  bool seen = false;
  for (int i = 0; i < 1000 && !seen; ++i) {
    try {
      m.poll();
      usleep(10000);
    } catch (const UserError& e) {
      seen = std::string(e.what()).find("injected checkpoint write fault") != std::string::npos;
    }
  }
  CHECK(seen);  // poll() reports it without a save
  set_write_fault_after_bytes(-1);
  m.wait();
  CHECK(count_temporaries(dir.path) == 0);
  std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, /*strict=*/true);
  REQUIRE(p);
  CHECK(p->step == 10);
  TrainState back = make_state(2, 0);
  load_checkpoint_file(p->path, back);
  check_equal(back, s10);
}

TEST_CASE("a crash at any point of a save leaves the previous checkpoint and LATEST loadable") {
  TempDir dir;
  TrainState s10 = make_state(21, 10);
  SaveResult first = write_checkpoint_atomic(dir.path, s10, {});
  const std::string latest_before = file_bytes(dir / "LATEST");
  const std::string file_before = file_bytes(first.path);
  TrainState s20 = make_host_state(22, 20);  // written in forked children
  const int64_t total = first.tensor_bytes;

  // Runs a save of s20 in a child that dies (_exit(137)) at the injected point.
  auto crash_child = [&](int64_t after_bytes, WriteFault stage) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      set_write_fault_exit(true);  // what RUNNER_CKPT_FAULT_EXIT=1 arms in the runner
      set_write_fault_after_bytes(after_bytes);
      set_write_fault_at(stage);
      try {
        write_checkpoint_atomic(dir.path, s20, {});
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };

  auto check_previous_intact = [&](const std::string& when) {
    INFO(when);
    CHECK(file_bytes(dir / "LATEST") == latest_before);
    CHECK(file_bytes(first.path) == file_before);
    std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, /*strict=*/true);
    REQUIRE(p);
    CHECK(p->step == 10);
    TrainState back = make_state(0, 0);
    load_checkpoint_file(p->path, back);
    check_equal(back, s10);
  };

  for (int k = 0; k < 20; ++k) {
    int64_t at = total * k / 20 + (k % 3);  // 20 points spread over the tensor data
    CHECK_MESSAGE(crash_child(at, WriteFault::None) == 137, "fault after " << at << " bytes");
    CHECK(count_temporaries(dir.path) == 1);  // what a crash leaves
    CHECK_FALSE(fs::exists(dir / "step_00000020.h5"));
    check_previous_intact("crash after " + std::to_string(at) + " bytes");
    CHECK(cleanup_stale(dir.path) == 1);
    CHECK(count_temporaries(dir.path) == 0);
  }
  for (WriteFault f : {WriteFault::BeforeClose, WriteFault::BeforeRename}) {
    CHECK(crash_child(-1, f) == 137);
    CHECK_FALSE(fs::exists(dir / "step_00000020.h5"));
    check_previous_intact("crash at stage " + std::to_string(static_cast<int>(f)));
    CHECK(cleanup_stale(dir.path) == 1);
  }
  // After the rename the new file is complete and verified; LATEST still names the old one.
  for (WriteFault f : {WriteFault::BeforeLatest, WriteFault::BeforeLatestRename}) {
    CHECK(crash_child(-1, f) == 137);
    CHECK(fs::exists(dir / "step_00000020.h5"));
    verify_checkpoint_file(dir / "step_00000020.h5");
    check_previous_intact("crash at stage " + std::to_string(static_cast<int>(f)));
    cleanup_stale(dir.path);
    fs::remove(dir / "step_00000020.h5");
  }
  // In-process (throwing) faults clean up after themselves.
  for (int64_t at : {int64_t{0}, total / 2}) {
    set_write_fault_after_bytes(at);
    CHECK_THROWS_AS(write_checkpoint_atomic(dir.path, s20, {}), CheckpointFault);
    set_write_fault_after_bytes(-1);
    CHECK(count_temporaries(dir.path) == 0);
    check_previous_intact("in-process fault");
  }
  // And the next save goes through.
  write_checkpoint_atomic(dir.path, s20, {});
  CHECK(read_latest(dir.path) == "step_00000020.h5");
}

TEST_CASE("corruption: each damage has its own message, and the loader falls back unless strict") {
  TempDir dir;
  TrainState s10 = make_state(31, 10), s20 = make_state(32, 20);
  write_checkpoint_atomic(dir.path, s10, {});
  write_checkpoint_atomic(dir.path, s20, {});
  const std::string f20 = dir / "step_00000020.h5";
  const std::string good20 = file_bytes(f20);

  // needle: what loading the file says; verified: what verifying it without a model says (the
  // resume chooser's message), when that differs.
  auto expect_fallback = [&](const std::string& needle, std::string verified = "") {
    if (verified.empty()) verified = needle;
    INFO("expected message: " << needle << " / " << verified);
    const int fds_before = open_fds();
    TrainState t = make_state(0, 0);
    std::string direct = user_error([&] { load_checkpoint_file(f20, t); });
    CHECK(direct.find(needle) != std::string::npos);
    CHECK(direct.find(f20) != std::string::npos);  // names the file
    // The resume chooser: strict makes the damage the error; otherwise it falls back.
    std::string strict = user_error([&] { choose_resume_point(dir.path, -1, /*strict=*/true); });
    CHECK(strict.find(verified) != std::string::npos);
    std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, /*strict=*/false);
    REQUIRE(p);
    CHECK(p->step == 10);
    REQUIRE(p->skipped.size() == 2);
    CHECK(p->skipped[0].find(verified) != std::string::npos);
    TrainState back = make_state(0, 0);
    load_checkpoint_file(p->path, back);
    check_equal(back, s10);
    bool ok = true;
    try {
      std::string report = inspect_checkpoint(f20, &ok);
      CHECK(report.find("BAD") != std::string::npos);
    } catch (const UserError&) {
      ok = false;  // not openable at all: inspect reports it as an error
    }
    CHECK_FALSE(ok);
    // Failed loads leak neither file descriptors nor HDF5 handles.
    CHECK(open_fds() == fds_before);
    CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0);
    write_bytes(f20, good20);
  };

  SUBCASE("truncated file") {
    write_bytes(f20, good20.substr(0, good20.size() / 2));
    expect_fallback("truncated");
  }
  SUBCASE("truncated inside the last dataset only") {
    write_bytes(f20, good20.substr(0, good20.size() - 10));
    expect_fallback("truncated");
  }
  SUBCASE("a flipped byte inside a tensor") {
    flip_byte(f20, dataset_offset(f20, "/params/h.0.attn.qkv.weight") + 4 * 100 + 1);
    expect_fallback("dataset /params/h.0.attn.qkv.weight fails its checksum");
  }
  SUBCASE("a flipped byte inside a moment") {
    flip_byte(f20, dataset_offset(f20, "/optimizer/adam_v/lnf.weight") + 7);
    expect_fallback("dataset /optimizer/adam_v/lnf.weight fails its checksum");
  }
  SUBCASE("a flipped byte in the stored recipe") {
    flip_byte(f20, dataset_offset(f20, "/recipe") + 3);
    expect_fallback("dataset /recipe fails its checksum");
  }
  SUBCASE("a flipped byte in /names (format 2's list of datasets)") {
    flip_byte(f20, dataset_offset(f20, "/names") + 5);
    expect_fallback("dataset /names fails its checksum");
  }
  SUBCASE("/names deleted") {
    delete_dataset(f20, "/names");
    expect_fallback("dataset /names is missing");
  }
  SUBCASE("a flipped byte in the HDF5 superblock, checked before HDF5 opens the file") {
    flip_byte(f20, 30);  // inside its end-of-file address
    expect_fallback("HDF5 superblock fails its checksum");
  }
  SUBCASE("a deleted dataset") {
    delete_dataset(f20, "/optimizer/adam_m/h.0.mlp.fc.weight");
    expect_fallback("dataset /optimizer/adam_m/h.0.mlp.fc.weight is missing");
  }
  SUBCASE("garbage named like a checkpoint") {
    std::string junk(5000, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(ops::mix64(i));
    write_bytes(f20, junk);
    expect_fallback("not an HDF5 file");
  }
  SUBCASE("an empty file") {
    write_bytes(f20, "");
    expect_fallback("empty");
  }
  SUBCASE("written by a newer format") {
    set_state_attr(f20, "format_version", kCheckpointFormatVersion + 1);
    expect_fallback("newer than this runner's");
  }
  SUBCASE("a changed step fails the /state checksum") {
    set_state_attr(f20, "step", 21);
    expect_fallback("/state attributes fail their checksum");
  }
  SUBCASE("a dataset of the wrong type") {
    hid_t f = H5Fopen(f20.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    REQUIRE(H5Ldelete(f, "/params/lnf.weight", H5P_DEFAULT) >= 0);
    hsize_t n = 32;
    hid_t sp = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(f, "/params/lnf.weight", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<int32_t> zeros(32, 0);
    H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
    expect_fallback("dataset /params/lnf.weight holds int32 but fp32", "dataset /params/lnf.weight has no crc32c attribute");
  }
  SUBCASE("LATEST names a file that is gone") {
    fs::remove(f20);
    CHECK(choose_resume_point(dir.path, -1, false)->step == 10);
    CHECK(user_error([&] { choose_resume_point(dir.path, -1, true); }).find("does not exist") != std::string::npos);
  }
  SUBCASE("no LATEST: the newest verifying step file, skipping garbage") {
    fs::remove(dir / "LATEST");
    write_bytes(dir / "step_00000030.h5", "not a checkpoint at all");
    std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, false);
    REQUIRE(p);
    CHECK(p->step == 20);
    TrainState back = make_state(0, 0);
    load_checkpoint_file(p->path, back);
    check_equal(back, s20);
  }
  SUBCASE("the checkpoint a run continues from is chosen once: the newest that verifies, recipe and tensors") {
    std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, false);
    REQUIRE(p);
    CHECK(p->step == 20);
    CHECK(p->skipped.empty());
    CHECK(read_recipe_text(p->path) == s20.recipe_yaml);
    CHECK(choose_resume_point(dir.path, 10, false)->step == 10);
    SUBCASE("a damaged recipe") { flip_byte(f20, dataset_offset(f20, "/recipe") + 3); }
    SUBCASE("a damaged tensor, the recipe intact") { flip_byte(f20, dataset_offset(f20, "/params/lnf.weight") + 5); }
    p = choose_resume_point(dir.path, -1, false);
    REQUIRE(p);
    CHECK(p->step == 10);
    CHECK(read_recipe_text(p->path) == s10.recipe_yaml);
    REQUIRE(p->skipped.size() == 2);
    CHECK(p->skipped[0].find("step_00000020.h5 does not verify") != std::string::npos);
    CHECK(p->skipped[1].find("instead of step_00000020.h5") != std::string::npos);
    CHECK(user_error([&] { choose_resume_point(dir.path, -1, true); }).find("fails its checksum") != std::string::npos);
    // The trainer then loads exactly that checkpoint (load_resume_point; on one fp32 rank, the file as it is).
    TrainState back = make_state(0, 0);
    load_checkpoint_file(p->path, back);
    CHECK(back.step == 10);
    check_equal(back, s10);
  }
  SUBCASE("an empty directory has no resume point") {
    fs::remove_all(dir.path);
    fs::create_directories(dir.path);
    CHECK_FALSE(choose_resume_point(dir.path, -1, false).has_value());
  }
  SUBCASE("nothing verifies: one error listing every failure") {
    write_bytes(f20, "junk");
    write_bytes(dir / "step_00000010.h5", "more junk");
    std::string msg = user_error([&] { choose_resume_point(dir.path, -1, false); });
    CHECK(msg.find("no checkpoint in this directory verifies") != std::string::npos);
    CHECK(msg.find("step_00000020.h5") != std::string::npos);
    CHECK(msg.find("step_00000010.h5") != std::string::npos);
  }
}

TEST_CASE("a model of another shape is refused with both shapes named") {
  TempDir dir;
  TrainState s10 = make_state(41, 10), s20 = make_state(42, 20);
  write_checkpoint_atomic(dir.path, s10, {});
  write_checkpoint_atomic(dir.path, s20, {});
  Shapes other = default_shapes();
  other[1].second = {48, 16};  // h.0.attn.qkv.weight

  TrainState wrong = make_state(0, 0, other);
  std::string msg = user_error([&] { load_checkpoint_file(dir / "step_00000020.h5", wrong); });
  CHECK(msg.find("dataset /params/h.0.attn.qkv.weight has shape (96, 32) but the model expects (48, 16)") != std::string::npos);
  CHECK(wrong.step == 0);  // scalars untouched on failure

  SUBCASE("a foreign checkpoint of another model as LATEST: it verifies, so it is chosen, and loading it names both shapes") {
    write_checkpoint_atomic(dir.path, make_state(43, 30, other), {});
    std::optional<ResumePoint> p = choose_resume_point(dir.path, -1, false);
    REQUIRE(p);
    CHECK(p->step == 30);
    CHECK(p->skipped.empty());
    TrainState back = make_state(0, 0);
    CHECK(user_error([&] { load_checkpoint_file(p->path, back); }).find("but the model expects (96, 32)") != std::string::npos);
    CHECK(back.step == 0);
  }
  SUBCASE("a parameter the model lacks") {
    Shapes fewer = default_shapes();
    fewer.pop_back();
    TrainState t = make_state(0, 0, fewer);
    CHECK(user_error([&] { load_checkpoint_file(dir / "step_00000020.h5", t); })
              .find("dataset /params/lnf.weight is a parameter the model does not have") != std::string::npos);
  }
}

TEST_CASE("retention keeps the last K plus every M-th, and deletes only after publishing") {
  TempDir dir;
  CheckpointConfig c = config();
  c.keep_last = 2;
  c.keep_every = 5;
  CheckpointSaver m(dir.path, c);
  TrainState s = make_state(51, 0);
  for (int64_t step = 1; step <= 12; ++step) {
    s.step = step;
    m.save(s);
  }
  CHECK(list_checkpoint_steps(dir.path) == std::vector<int64_t>{5, 10, 11, 12});
  CHECK(read_latest(dir.path) == "step_00000012.h5");
  m.save(s);  // same step again: skipped
  CHECK(m.saves_completed() == 12);

  SUBCASE("checkpoints newer than a resume point are left alone") {
    CheckpointConfig c2 = c;
    c2.keep_every = 0;
    CheckpointSaver m2(dir.path, c2);
    std::optional<ResumePoint> p = choose_resume_point(dir.path, 5, true);
    REQUIRE(p);
    TrainState back = make_state(0, 0);
    load_checkpoint_file(p->path, back);
    CHECK(back.step == 5);
    m2.resumed_at(5);
    m2.save(back);  // the step resumed from is on disk: skipped
    CHECK(m2.saves_completed() == 0);
    back.step = 6;
    m2.save(back);
    CHECK(list_checkpoint_steps(dir.path) == std::vector<int64_t>{5, 6, 10, 11, 12});
    CHECK(read_latest(dir.path) == "step_00000006.h5");
  }
  SUBCASE("resuming from a missing step lists what exists") {
    std::string msg = user_error([&] { choose_resume_point(dir.path, 7, false); });
    CHECK(msg.find("no checkpoint for step 7") != std::string::npos);
    CHECK(msg.find("5, 10, 11, 12") != std::string::npos);
  }
}

TEST_CASE("cadence: after_step saves when steps, minutes, auto (20 x the measured write time) say so; never does not") {
  TempDir dir;
  TrainState s = make_state(60, 0);
  // after_step at the boundary after `step`, `elapsed` seconds into the run: whether it saved.
  auto after = [&](CheckpointSaver& m, int64_t step, double elapsed) {
    s.step = step;
    return m.after_step(s, elapsed);
  };
  SUBCASE("steps") {
    CheckpointSaver m(dir.path, config("steps"));
    CHECK_FALSE(after(m, 5, 0));
    CHECK(after(m, 10, 0));
    CHECK(after(m, 20, 0));
    CHECK(list_checkpoint_steps(dir.path) == std::vector<int64_t>{10, 20});
  }
  SUBCASE("minutes") {
    CheckpointConfig c = config("minutes");
    c.every_minutes = 1;
    CheckpointSaver m(dir.path, c);
    CHECK_FALSE(after(m, 1, 30));
    CHECK(after(m, 2, 60));
    CHECK_FALSE(after(m, 3, 100));
    CHECK(after(m, 4, 121));
    CHECK(list_checkpoint_steps(dir.path) == std::vector<int64_t>{2, 4});
  }
  SUBCASE("never") {
    CheckpointSaver m(dir.path, config("never"));
    for (int64_t step = 1; step < 50; ++step) CHECK_FALSE(after(m, step, 1e9));
    CHECK(m.saves_completed() == 0);
  }
  SUBCASE("a step resumed from is not saved again") {
    CheckpointSaver m(dir.path, config("steps"));
    m.resumed_at(10);
    CHECK_FALSE(after(m, 10, 0));
    CHECK(after(m, 20, 0));
  }
  SUBCASE("auto") {
    for (bool async : {false, true}) {
      TempDir d;
      CheckpointSaver m(d.path, config("auto", async));
      m.auto_min_interval_seconds = 0;
      CHECK(m.auto_interval_seconds() == 0);
      CHECK(after(m, 1, 0.5));  // the first boundary saves, to measure
      m.wait();
      const double w = m.last_write_seconds();
      CHECK(w > 0);
      CHECK(m.auto_interval_seconds() == doctest::Approx(20 * w));
      CHECK_FALSE(after(m, 2, 0.5 + 20 * w * 0.5));
      CHECK_FALSE(after(m, 3, 0.5 + 20 * w * 0.9));
      CHECK(after(m, 4, 0.5 + 20 * w * 1.01));
      CHECK_FALSE(after(m, 5, 0.5 + 20 * w * 1.02));
      m.wait();
      CHECK(m.saves_completed() == 2);
    }
    TempDir d;
    CheckpointSaver m(d.path, config("auto"));  // the default floor keeps tiny models from saving constantly
    CHECK(after(m, 1, 0));
    CHECK(m.auto_interval_seconds() == doctest::Approx(m.auto_min_interval_seconds));
  }
}

TEST_CASE("cleanup_stale removes crashed writers' temporaries only") {
  TempDir dir;
  write_bytes(dir / ".step_00000005.h5.tmp.12345", "partial");
  write_bytes(dir / ".LATEST.tmp.999", "step_");
  write_bytes(dir / "notes.txt", "keep");
  write_bytes(dir / "step_00000001.h5", "keep");
  write_bytes(dir / "LATEST", "step_00000001.h5\n");
  CHECK(cleanup_stale(dir.path) == 2);
  CHECK(fs::exists(dir / "notes.txt"));
  CHECK(fs::exists(dir / "step_00000001.h5"));
  CHECK(fs::exists(dir / "LATEST"));
  CHECK(count_temporaries(dir.path) == 0);
  CHECK(cleanup_stale(dir / "does-not-exist") == 0);
}

TEST_CASE("memory snapshot restores the state bit for bit") {
  TrainState s = make_state(71, 30);
  MemorySnapshot snap;
  CHECK_FALSE(snap.valid());
  snap.take(s);
  CHECK(snap.valid());
  CHECK(snap.step() == 30);
  CHECK(snap.bytes() == 3 * 9376 * 4);
  TrainState expect = clone_state(s, ops::Account::Workspace);
  // Train on: everything moves.
  for (size_t i = 0; i < s.params.values.size(); ++i) {
    fill_random(s.params.values[i], 900 + i);
    fill_random(s.adam_m[i], 950 + i);
  }
  s.step = 31;
  s.tokens += 100;
  s.loader.sample_cursor += 8;
  s.rng.sample_counter += 1;
  s.scaler.scale = 1;
  s.loss_ema = 99;
  snap.restore(s);
  check_equal(s, expect);
  // Taken again (shapes unchanged: buffers reused), then restored after more changes.
  s.step = 32;
  snap.take(s);
  CHECK(snap.step() == 32);
  fill_random(s.adam_v[2], 4242);
  snap.restore(s);
  expect.step = 32;
  check_equal(s, expect);
}

TEST_CASE("format 2 lists every dataset in /names and readers open them by name; format 1 is still read") {
  TempDir dir;
  TrainState s = make_state(83, 20);
  SaveResult r = write_checkpoint_atomic(dir.path, s, {});
  // /names: /recipe, the rank entries, then each tree in model order.
  std::string want = "/recipe\n/rng/rank_0\n/data/rank_0\n";
  for (const char* g : {"/params/", "/optimizer/adam_m/", "/optimizer/adam_v/"})
    for (auto& n : s.params.names) want += g + n + "\n";
  CHECK(names_of(r.path) == want);

  // A dataset outside /names is not looked at: nothing iterates the file's groups.
  add_stray_dataset(r.path);
  TrainState back = make_state(0, 0);
  load_checkpoint_file(r.path, back);
  check_equal(back, s);
  verify_checkpoint_file(r.path);
  bool ok = false;
  std::string rep = inspect_checkpoint(r.path, &ok);
  CHECK_MESSAGE(ok, rep);
  CHECK(rep.find("as /names lists them") != std::string::npos);
  CHECK(rep.find("/stray") == std::string::npos);

  // Format 1 (no /names): the groups are iterated, so the stray dataset shows (it has no
  // checksum); loading is unchanged and bit-exact.
  downgrade_to_format1(r.path);
  TrainState back1 = make_state(0, 0);
  load_checkpoint_file(r.path, back1);
  check_equal(back1, s);
  rep = inspect_checkpoint(r.path, &ok);
  CHECK(rep.find("format 1,") != std::string::npos);
  CHECK(rep.find("found by iterating the groups") != std::string::npos);
  CHECK(rep.find("/stray") != std::string::npos);
  CHECK(rep.find("/params/lnf.weight") != std::string::npos);
  CHECK_FALSE(ok);
  CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0);
}

TEST_CASE("inspect lists every dataset with its checksum status") {
  TempDir dir;
  TrainState s = make_state(81, 20);
  SaveResult r = write_checkpoint_atomic(dir.path, s, {});
  bool ok = false;
  std::string rep = inspect_checkpoint(r.path, &ok);
  CHECK(ok);
  for (const char* needle : {"step 20", "format 2", "runner " RUNNER_VERSION, "recipe: tiny", "d_model=32",
                             "/params/h.0.attn.qkv.weight", "(96, 32)", "fp32", "/optimizer/adam_v/lnf.weight",
                             "/rng/rank_0", "/data/rank_0", "sample_cursor 163", "verdict: OK"})
    CHECK_MESSAGE(rep.find(needle) != std::string::npos, needle << "\n" << rep);
  flip_byte(r.path, dataset_offset(r.path, "/params/wte.weight") + 9);
  rep = inspect_checkpoint(r.path, &ok);
  CHECK_FALSE(ok);
  CHECK(rep.find("/params/wte.weight") != std::string::npos);
  CHECK(rep.find("BAD: dataset /params/wte.weight fails its checksum") != std::string::npos);
  // 22: /names, /recipe, /rng/rank_0, /data/rank_0 and 3 x 6 tensors (format 1 had 21, without /names)
  CHECK(rep.find("verdict: BAD (1 problem in 22 datasets)") != std::string::npos);
  CHECK(user_error([&] { inspect_checkpoint(dir / "nope.h5"); }).find("does not exist") != std::string::npos);
}

TEST_CASE("signals: the first (SIGTERM, SIGUSR1, SIGINT) sets the stop flag, the second exits with 128 + its number") {
  reset_stop_for_test();
  CHECK_FALSE(stop_requested());
  request_stop_for_test();
  CHECK(stop_requested());
  CHECK(stop_flag().load());
  CHECK(std::string(stop_signal_name()) == "a stop request");
  reset_stop_for_test();
  CHECK_FALSE(stop_requested());

  // Ctrl-C stops like SIGTERM (the run keeps its work); a second Ctrl-C exits 130.
  const char* names[] = {"SIGTERM", "SIGUSR1", "SIGINT (Ctrl-C)"};
  const int sigs[] = {SIGTERM, SIGUSR1, SIGINT};
  for (int second : {SIGTERM, SIGINT})
    for (int k = 0; k < 3; ++k) {
      CAPTURE(sigs[k]);
      CAPTURE(second);
      pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        install_signal_handlers();
        raise(sigs[k]);
        if (!stop_requested() || stop_signal() != sigs[k] || std::string(stop_signal_name()) != names[k]) _exit(10);
        raise(second);  // the second signal: never returns
        _exit(11);
      }
      int status = 0;
      REQUIRE(waitpid(pid, &status, 0) == pid);
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == (second == SIGINT ? kExitInterruptAbort : kExitSignalAbort));
    }
  CHECK(kExitPreempted == 3);
  CHECK(kExitSignalAbort == 143);
  CHECK(kExitInterruptAbort == 130);
}

TEST_CASE("a written file holds exactly the objects of checkpoint_layout, in its order of creation") {
  TempDir dir;
  TrainState s = make_state(91, 30);
  s.world_size = 3;  // three /rng and /data entries
  const std::string path = dir / "layout.h5";
  write_checkpoint_file(path, s, {});
  // Every link, depth first in creation order (how h5py and the reader list the file).
  std::vector<std::string> links;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  REQUIRE(H5Lvisit(f, H5_INDEX_CRT_ORDER, H5_ITER_INC,
                   [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
                     static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
                     return 0;
                   },
                   &links) >= 0);
  H5Fclose(f);
  std::vector<std::string> expected;
  for (const auto& e : ckpt::checkpoint_layout(3, s.params.names)) expected.push_back(e.path);
  CHECK(links == expected);
  CHECK(expected.front() == "/state");
  CHECK(expected.back() == "/optimizer/adam_v/lnf.weight");
  CHECK(ckpt::tensor_path(ckpt::kAdamM, "wte.weight") == "/optimizer/adam_m/wte.weight");
  CHECK(ckpt::rng_path(2) == "/rng/rank_2");
  CHECK(ckpt::data_path(1) == "/data/rank_1");
}

TEST_CASE("the HDF5 lock: one process-wide lock (the data loader's), re-entrant within a thread") {
  using namespace std::chrono_literals;
  std::atomic<bool> other_entered{false};
  std::thread other;
  {
    h5::Lock outer;
    {
      h5::Lock inner;  // the same thread again: no deadlock
      CHECK_FALSE(h5::mutex().try_lock());  // the one process-wide mutex is held
    }
    other = std::thread([&] {
      h5::Lock l;
      other_entered = true;
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(other_entered.load());  // still held: the inner lock's release did not release it
  }
  other.join();
  CHECK(other_entered.load());
  // A handle closes under the lock it takes itself, with or without one held by its owner.
  h5::Id space;
  {
    h5::Lock l;
    space = h5::Id(H5Screate(H5S_SCALAR), H5Sclose);
  }
  CHECK(space.ok());
  CHECK(space.close());
  CHECK_FALSE(space.ok());
  CHECK(h5::mutex().try_lock());  // nothing left held
  h5::mutex().unlock();
}

// The crossing between device tensors and checkpoints, on the strict device whatever
// RUNNER_STRICT says (its memory faults on any host access, so reaching the end proves that no
// save, load or snapshot path dereferenced a device tensor).
TEST_CASE("a state on the strict device: saves write the host state's bytes, async saves stage out, loads copy in") {
  ops::Backend& dev = ops::strict::strict_backend();
  TempDir d_host, d_sync, d_async;
  TrainState h = make_state(11, 10, default_shapes(), nullptr);
  write_checkpoint_atomic(d_host.path, h, {});
  const std::string name = "step_00000010.h5";
  {
    TrainState d = make_state(11, 10, default_shapes(), &dev);
    write_checkpoint_atomic(d_sync.path, d, {});
    const int64_t out_before = ops::strict::strict_stats().copies_out;
    CheckpointSaver async(d_async.path, config("steps", true));
    // Kernels still queued ahead of the save (as training leaves them): its copies run after
    // them, so a writer that read its buffers without waiting would write the poison.
    ops::Tensor x({1024, 1024}, ops::DType::F32, ops::Account::Workspace, true, &dev), y = x.clone(ops::Account::Workspace);
    for (int k = 0; k < 4; ++k) dev.run(ops::k::MatmulForward(y.data<float>(), x.data<float>(), x.data<float>(), nullptr, 1024, 1024, 1024));
    async.save(d);
    // Staged: one copy out per tensor (params, m, v), queued on the device's queue.
    CHECK(ops::strict::strict_stats().copies_out - out_before == 3 * static_cast<int64_t>(d.params.values.size()));
    fill_random(d.params.values[0], 12345);  // training goes on (queued after the staged copies)
    d.step = 11;
    async.wait();
  }
  CHECK(file_bytes(d_host / name) == file_bytes(d_sync / name));
  CHECK(file_bytes(d_host / name) == file_bytes(d_async / name));
  TrainState back = make_state(0, 0, default_shapes(), &dev);
  back.adam_m.clear();  // allocated on load, beside the values (on the device)
  back.adam_v.clear();
  load_checkpoint_file(d_async / name, back);
  REQUIRE(back.adam_m.size() == h.adam_m.size());
  CHECK(back.adam_m[0].device() == &dev);
  check_equal(back, h);
}

TEST_CASE("a memory snapshot of strict-device tensors is staged out to host memory and copied back in bit for bit") {
  ops::Backend& dev = ops::strict::strict_backend();
  TrainState s = make_state(71, 30, default_shapes(), &dev);
  TrainState expect = make_state(71, 30, default_shapes(), nullptr);
  MemorySnapshot snap;
  snap.take(s);
  CHECK(snap.bytes() == 3 * 9376 * 4);
  for (size_t i = 0; i < s.params.values.size(); ++i) {  // train on: everything moves
    fill_random(s.params.values[i], 900 + i);
    fill_random(s.adam_v[i], 950 + i);
  }
  s.step = 31;
  snap.restore(s);
  check_equal(s, expect);
  CHECK(s.params.values[0].device() == &dev);
  // Moments allocated on restore go beside the values.
  s.adam_m.clear();
  s.adam_v.clear();
  snap.restore(s);
  REQUIRE(s.adam_m.size() == expect.adam_m.size());
  CHECK(s.adam_m[0].device() == &dev);
  check_equal(s, expect);
}

TEST_CASE("16-bit strict-device values without masters are widened on the device for a checkpoint") {
  ops::Backend& dev = ops::strict::strict_backend();
  TrainState h = make_state(5, 3, default_shapes(), nullptr), d = make_state(5, 3, default_shapes(), &dev);
  for (TrainState* s : {&h, &d})
    for (auto& v : s->params.values) {
      ops::Tensor b(v.shape(), ops::DType::BF16, ops::Account::Parameters, false, v.device());
      if (v.on_host()) ops::cpu_backend().run(ops::k::Convert(b.raw(), ops::DType::BF16, v.raw(), ops::DType::F32, v.numel()));
      else dev.run(ops::k::Convert(b.raw(), ops::DType::BF16, v.raw(), ops::DType::F32, v.numel()));
      v = b;
    }
  TempDir a, b;
  CheckpointConfig cfg = config("steps", false);
  CheckpointSaver(a.path, cfg).save(h, true);
  CheckpointSaver(b.path, cfg).save(d, true);
  CHECK(file_bytes(a / "step_00000003.h5") == file_bytes(b / "step_00000003.h5"));
}
