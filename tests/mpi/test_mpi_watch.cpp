// The comm layer's wait marks (parallel/watch.h), across real ranks: a blocking collective, a
// point-to-point receive on a split communicator and a non-blocking wait are each seen by a
// second thread while they block, with the operation, the group, its members' world ranks,
// the peer's world rank and a call number the same on every member; nothing is seen with
// marking off. Run under MPI with 4 ranks (CMake registers it so). The watchdog's behaviour
// end to end is tests/test_watchdog.cpp.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_doctest.h"
#include "parallel/comm.h"
#include "parallel/watch.h"

using namespace parallel;

namespace {

int g_rank = -1;

#define RANK_INFO() INFO("rank " << g_rank)

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Runs `blocking` on this thread while another thread watches the mark; the first active
// mark it saw (active false: none).
WaitInfo observe(const std::function<void()>& blocking) {
  std::atomic<bool> done{false};
  WaitInfo seen;
  std::thread t([&] {
    while (!done.load()) {
      WaitInfo w = watch_current();
      if (w.active) {
        seen = w;
        return;
      }
      std::this_thread::yield();
    }
  });
  blocking();
  done = true;
  t.join();
  return seen;
}

struct Marking {
  Marking() { watch_enable(true); }
  ~Marking() { watch_enable(false); }
};

}  // namespace

TEST_CASE("a blocking collective is marked while it waits: op, group, members, call number") {
  RANK_INFO();
  Marking on;
  auto world = mpi_world();
  world->set_name("world");
  world->barrier();
  const int64_t t0 = watch_now_ns();
  // Rank 3 arrives late, so the others block in the allreduce long enough to be seen.
  const WaitInfo w = observe([&] {
    if (g_rank == 3) sleep_ms(300);
    int64_t x = 1;
    world->allreduce_sum(&x, 1);
  });
  if (g_rank != 3) {
    CHECK(w.active);
    CHECK(w.op == CommOp::Allreduce);
    CHECK(std::string(w.group) == "world");
    CHECK(w.ranks.first == 0);
    CHECK(w.ranks.stride == 1);
    CHECK(w.ranks.size == 4);
    CHECK(w.peer == -1);
    CHECK(w.bytes == 8);
    CHECK(w.since_ns >= t0);
  }
  CHECK_FALSE(watch_current().active);  // the mark ends with the call
  // The call number is the same on every member (rank 3 may not have been seen: take it from rank 0).
  int64_t seq = g_rank == 0 ? w.seq : 0;
  world->allreduce_sum(&seq, 1);
  if (g_rank != 3) CHECK(w.seq == seq);
  CHECK(seq >= 2);  // the barrier was call 1
}

TEST_CASE("a receive on a split communicator names its peer by world rank and the group's members") {
  RANK_INFO();
  Marking on;
  auto world = mpi_world();
  auto odd = world->split(g_rank % 2, g_rank);  // {0, 2} and {1, 3}
  odd->set_name("pair");
  const WaitInfo w = observe([&] {
    char b[16] = {0};
    if (odd->rank() == 0) {
      odd->recv(b, sizeof b, 1, 7);
    } else {
      sleep_ms(300);
      odd->send(b, sizeof b, 0, 7);
    }
  });
  if (odd->rank() == 0) {
    CHECK(w.active);
    CHECK(w.op == CommOp::Recv);
    CHECK(std::string(w.group) == "pair");
    CHECK(w.peer == g_rank + 2);  // member 1 of the pair, as a world rank
    CHECK(w.bytes == 16);
    CHECK(w.ranks.first == g_rank % 2);
    CHECK(w.ranks.stride == 2);
    CHECK(w.ranks.size == 2);
  }
  world->barrier();
}

TEST_CASE("a wait on a non-blocking collective is marked; with marking off nothing is") {
  RANK_INFO();
  auto world = mpi_world();
  world->set_name("world");
  {
    Marking on;
    const WaitInfo w = observe([&] {
      float x[4] = {1, 2, 3, 4};
      auto r = world->iallreduce_sum(x, 4);
      if (g_rank == 0) sleep_ms(300);
      r->wait();
    });
    if (g_rank != 0) {
      CHECK(w.active);
      CHECK(w.op == CommOp::Iallreduce);
      CHECK(w.bytes == 16);
    }
  }
  const WaitInfo off = observe([&] {
    if (g_rank == 0) sleep_ms(200);
    world->barrier();
  });
  CHECK_FALSE(off.active);
}

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  const int rc = mpi_doctest::run(argc, argv, "test_mpi_watch", &g_rank);
  finalize_mpi();
  return rc;
}
