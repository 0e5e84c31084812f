// Pipeline schedules (parallel/pipeline.h), checked by simulating every stage at once.
//
// Each stage runs its schedule's actions in order; a forward of micro-batch m on stage s can
// start once stage s-1 finished that forward, a backward once stage s+1 finished that backward
// (the last stage: once its own forward finished). Sends never block (the trainer's are
// non-blocking), receives do. The simulation must finish (no deadlock), hold at most the
// activations the plan's ledger assumes, and take the textbook time (m + p - 1)(tf + tb), i.e.
// a bubble of (p-1)/(m+p-1).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline.h"

namespace {

struct Sim {
  double makespan = 0;
  std::vector<double> busy;
  bool deadlock = false;
};

// Virtual stage of chunk c on stage s: c*p + s (one chunk per stage except interleaved).
Sim simulate(const std::string& name, int p, int m, double tf, double tb, int v = 1) {
  std::vector<std::vector<parallel::PipeAction>> sched;
  for (int s = 0; s < p; ++s) sched.push_back(parallel::pipeline_schedule(name, s, p, m, v));
  const int last = p * v - 1;
  std::map<std::tuple<int, int, bool>, double> done;  // (virtual stage, micro, forward) -> finish time
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  Sim r;
  r.busy.assign(static_cast<size_t>(p), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      auto& i = pc[static_cast<size_t>(s)];
      if (i == sched[static_cast<size_t>(s)].size()) continue;
      const auto& a = sched[static_cast<size_t>(s)][i];
      const int vs = a.chunk * p + s;
      std::tuple<int, int, bool> dep = a.forward ? std::make_tuple(vs - 1, a.micro, true)
                                                 : (vs == last ? std::make_tuple(vs, a.micro, true) : std::make_tuple(vs + 1, a.micro, false));
      double ready = 0;
      if (!(a.forward && vs == 0)) {
        auto it = done.find(dep);
        if (it == done.end()) continue;  // blocked on a receive
        ready = it->second;
      }
      double start = std::max(ready, free_at[static_cast<size_t>(s)]);
      double t = a.forward ? tf : tb;
      free_at[static_cast<size_t>(s)] = start + t;
      r.busy[static_cast<size_t>(s)] += t;
      done[{vs, a.micro, a.forward}] = start + t;
      ++i;
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    if (pc[static_cast<size_t>(s)] != sched[static_cast<size_t>(s)].size()) r.deadlock = true;
    r.makespan = std::max(r.makespan, free_at[static_cast<size_t>(s)]);
  }
  return r;
}

}  // namespace

TEST_CASE("every stage runs each micro-batch's forward once, then its backward once") {
  for (const char* name : {"1f1b", "gpipe"})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m)
        for (int s = 0; s < p; ++s) {
          auto sc = parallel::pipeline_schedule(name, s, p, m);
          REQUIRE(sc.size() == static_cast<size_t>(2 * m));
          std::vector<int> fwd_at(static_cast<size_t>(m), -1), bwd_at(static_cast<size_t>(m), -1);
          for (int k = 0; k < static_cast<int>(sc.size()); ++k)
            (sc[static_cast<size_t>(k)].forward ? fwd_at : bwd_at)[static_cast<size_t>(sc[static_cast<size_t>(k)].micro)] = k;
          for (int mb = 0; mb < m; ++mb) {
            CHECK(fwd_at[static_cast<size_t>(mb)] >= 0);
            CHECK(bwd_at[static_cast<size_t>(mb)] > fwd_at[static_cast<size_t>(mb)]);
          }
        }
}

TEST_CASE("1F1B holds min(p - s, m) micro-batches on stage s, GPipe all m (the ledger's assumption)") {
  for (int p = 1; p <= 4; ++p)
    for (int m = 1; m <= 8; ++m)
      for (int s = 0; s < p; ++s) {
        CHECK(parallel::max_in_flight(parallel::schedule_1f1b(s, p, m)) == std::min(p - s, m));
        CHECK(parallel::max_in_flight(parallel::schedule_gpipe(s, p, m)) == m);
      }
}

TEST_CASE("both schedules finish without deadlock in (m + p - 1)(tf + tb): the bubble is (p-1)/(m+p-1)") {
  for (const char* name : {"1f1b", "gpipe"})
    for (int p = 1; p <= 4; ++p)
      for (int m = p; m <= 8; ++m) {
        CAPTURE(name);
        CAPTURE(p);
        CAPTURE(m);
        Sim r = simulate(name, p, m, 1.0, 2.0);
        REQUIRE_FALSE(r.deadlock);
        CHECK(r.makespan == doctest::Approx((m + p - 1) * 3.0));
        for (double b : r.busy) CHECK(1.0 - b / r.makespan == doctest::Approx(double(p - 1) / (m + p - 1)));
      }
}

TEST_CASE("interleaved 1F1B: every (micro-batch, chunk) once each way, no deadlock, bubble (p-1)/(v*m+p-1)") {
  for (int p = 2; p <= 4; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        for (int s = 0; s < p; ++s) {
          auto sc = parallel::schedule_interleaved(s, p, m, v);
          REQUIRE(sc.size() == static_cast<size_t>(2 * m * v));
          std::map<std::pair<int, int>, int> fwd, bwd;
          for (int k = 0; k < static_cast<int>(sc.size()); ++k) {
            const auto& a = sc[static_cast<size_t>(k)];
            CHECK(a.chunk >= 0);
            CHECK(a.chunk < v);
            (a.forward ? fwd : bwd)[{a.micro, a.chunk}] = k;
          }
          CHECK(fwd.size() == static_cast<size_t>(m * v));
          CHECK(bwd.size() == static_cast<size_t>(m * v));
          for (auto& [key, k] : fwd) CHECK(bwd.at(key) > k);
        }
        // Each chunk costs 1/v of a stage's forward (1) and backward (2).
        Sim r = simulate("interleaved", p, m, 1.0 / v, 2.0 / v, v);
        REQUIRE_FALSE(r.deadlock);
        double ideal = m * 3.0;  // the stage's own work
        for (double b : r.busy) CHECK(b == doctest::Approx(ideal));
        CHECK(1.0 - ideal / r.makespan == doctest::Approx(double(p - 1) / (v * m + p - 1)));
      }
  CHECK_THROWS_AS(parallel::schedule_interleaved(0, 2, 3, 2), std::invalid_argument);  // m not a multiple of p
}

TEST_CASE("an unknown schedule is refused") {
  CHECK_THROWS_AS(parallel::pipeline_schedule("zigzag", 0, 2, 4), std::invalid_argument);
}
