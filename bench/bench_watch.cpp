// The cost of the watchdog's wait marks (parallel/watch.h), against the calls they
// mark: one mark (begin + end, a clock read and a dozen relaxed stores) with the watchdog on
// and with it off, and a one-element MPI_Allreduce on one rank (the cheapest collective there
// is; real ones cost microseconds to seconds). Prints nanoseconds per call and the mark's
// share of the allreduce.
//   build/bench_watch
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "parallel/comm.h"
#include "parallel/watch.h"

namespace {

template <class F>
double ns_per(int n, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  parallel::init_mpi(&argc, &argv);
  auto world = parallel::mpi_world();
  constexpr int kN = 2000000;
  parallel::WaitInfo w;
  w.op = parallel::CommOp::Allreduce;
  w.group = "world";
  parallel::watch_enable(false);
  const double off = ns_per(kN, [&] { parallel::WaitMark m(w); });
  parallel::watch_enable(true);
  const double on = ns_per(kN, [&] { parallel::WaitMark m(w); });
  // Alternating rounds, so warm-up and the machine's noise fall on both sides alike.
  int64_t x = 1;
  double ar_on = 1e300, ar_off = 1e300;
  for (int round = 0; round < 4; ++round) {
    parallel::watch_enable(round % 2 == 1);
    world->barrier();
    const double t = ns_per(kN / 20, [&] { world->allreduce_sum(&x, 1); });
    (round % 2 == 1 ? ar_on : ar_off) = std::min(round % 2 == 1 ? ar_on : ar_off, t);
  }
  parallel::watch_enable(false);
  std::printf("mark, watchdog off: %.1f ns\nmark, watchdog on:  %.1f ns\n", off, on);
  std::printf("1-element allreduce on %d rank(s), best of 2 rounds each: %.1f ns marked, %.1f ns unmarked (ratio %.3f)\n",
              world->size(), ar_on, ar_off, ar_on / ar_off);
  world.reset();
  parallel::finalize_mpi();
  return 0;
}
