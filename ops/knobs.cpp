// Reading the RUNNER_* knobs (knobs.h); the only place in the project that calls getenv for one.
#include "ops/knobs.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace ops {

namespace {

class Reader {
 public:
  explicit Reader(const char* (*lookup)(const char*)) : lookup_(lookup) {}

  // The value, or nullptr when unset or empty.
  const char* raw(const char* name) const {
    const char* v = lookup_(name);
    return v && *v ? v : nullptr;
  }
  std::string str(const char* name) const {
    const char* v = raw(name);
    return v ? v : "";
  }
  std::optional<int64_t> integer(const char* name) const {
    const char* v = raw(name);
    if (!v) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') bad(name, v, "an integer");
    return static_cast<int64_t>(x);
  }
  std::optional<double> number(const char* name) const {
    const char* v = raw(name);
    if (!v) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0') bad(name, v, "a number");
    return x;
  }
  bool flag(const char* name, bool unset) const {
    const char* v = raw(name);
    if (!v) return unset;
    const std::string s = v;
    if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
    if (s == "0" || s == "false" || s == "no" || s == "off") return false;
    bad(name, v, "1 or 0 (true/false, yes/no, on/off)");
  }

 private:
  [[noreturn]] static void bad(const char* name, const char* value, const char* expected) {
    throw std::invalid_argument(std::string(name) + "=" + value + ": expected " + expected +
                                " (docs/knobs.md lists the RUNNER_* variables), or unset it");
  }
  const char* (*lookup_)(const char*);
};

const char* process_env(const char* name) { return std::getenv(name); }

// The knobs read last. Published through an atomic so that threads which read them after start
// (the data loader's workers, the executor) need no lock; a reload keeps the old table alive,
// since a caller may hold a reference into it (reloads are the tests', and few).
std::atomic<const Knobs*> g_knobs{nullptr};
std::mutex g_mu;
std::vector<std::unique_ptr<const Knobs>> g_read;

}  // namespace

bool Knobs::Faults::any_step_fault() const {
  return fail_rank || fail_step || nan_step || inf_step || inf_count || noise_step || step_sleep_ms || stall_rank ||
         stall_every || stall_ms || ckpt_sleep_ms || !step_sleep_file.empty();
}

Knobs read_knobs(const char* (*lookup)(const char* name)) {
  const Reader r(lookup);
  Knobs k;
  k.gemm_path = r.str("RUNNER_GEMM_PATH");
  k.peak_cache = r.str("RUNNER_PEAK_CACHE");
  k.schema = r.str("RUNNER_SCHEMA");
  k.host_staged_comm = r.flag("RUNNER_HOST_STAGED_COMM", false);
  k.native16 = r.flag("RUNNER_NATIVE16", true);
  k.strict_arena_gib = r.number("RUNNER_STRICT_ARENA_GIB");
  k.strict = r.flag("RUNNER_STRICT", false);
  k.exit_record = r.str("RUNNER_EXIT_RECORD");

  Knobs::Faults& f = k.faults;
  f.fail_rank = r.integer("RUNNER_FAULT_FAIL_RANK");
  f.fail_step = r.integer("RUNNER_FAULT_FAIL_STEP");
  f.nan_step = r.integer("RUNNER_FAULT_NAN_STEP");
  f.inf_step = r.integer("RUNNER_FAULT_INF_STEP");
  f.inf_count = r.integer("RUNNER_FAULT_INF_COUNT");
  f.noise_step = r.integer("RUNNER_FAULT_NOISE_STEP");
  f.step_sleep_ms = r.integer("RUNNER_FAULT_STEP_SLEEP_MS");
  f.step_sleep_rank = r.integer("RUNNER_FAULT_STEP_SLEEP_RANK");
  f.step_sleep_file = r.str("RUNNER_FAULT_STEP_SLEEP_FILE");
  f.ckpt_sleep_ms = r.integer("RUNNER_FAULT_CKPT_SLEEP_MS");
  f.ckpt_sleep_rank = r.integer("RUNNER_FAULT_CKPT_SLEEP_RANK");
  f.stall_rank = r.integer("RUNNER_DEBUG_STALL_RANK");
  f.stall_every = r.integer("RUNNER_DEBUG_STALL_EVERY");
  f.stall_ms = r.integer("RUNNER_DEBUG_STALL_MS");
  f.data_delay_ms = r.integer("RUNNER_DEBUG_DATA_DELAY_MS");
  f.ckpt_after_bytes = r.integer("RUNNER_CKPT_FAULT_AFTER_BYTES");
  f.ckpt_exit = r.flag("RUNNER_CKPT_FAULT_EXIT", false);
  f.ckpt_slow_ms = r.integer("RUNNER_CKPT_FAULT_SLOW_MS");
  f.ckpt_verify_abort = r.str("RUNNER_CKPT_FAULT_VERIFY_ABORT");

  k.expect_gpu = r.flag("RUNNER_EXPECT_GPU", false);
  k.keep_test_dirs = r.flag("RUNNER_KEEP_TEST_DIRS", false);
  k.pckpt_child = r.str("RUNNER_PCKPT_CHILD");
  return k;
}

const Knobs& knobs() {
  if (const Knobs* k = g_knobs.load(std::memory_order_acquire)) return *k;
  std::lock_guard<std::mutex> lock(g_mu);
  if (const Knobs* k = g_knobs.load(std::memory_order_acquire)) return *k;
  // A throw leaves the table unset: the next call reports the malformed value again.
  g_read.push_back(std::make_unique<const Knobs>(read_knobs(process_env)));
  g_knobs.store(g_read.back().get(), std::memory_order_release);
  return *g_read.back();
}

const Knobs& reload_knobs() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_knobs.store(nullptr, std::memory_order_release);
  }
  return knobs();
}

}  // namespace ops
