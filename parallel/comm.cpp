// Communicators: SelfComm (one rank, no MPI) and MpiComm (the MPI C API).
//
// Bit-identical reductions. We rely on the MPI library rather than adding a second collective:
// every allreduce algorithm in Open MPI (coll/basic, coll/tuned: linear, nonoverlapping,
// recursive doubling, ring, segmented ring, Rabenseifner; coll/han; libnbc for the
// non-blocking MPI_Iallreduce: binomial reduce+bcast, ring, recursive doubling,
// reduce-scatter+allgather) either computes each result element once and then copies it to
// every member, or computes it symmetrically (recursive doubling: both partners combine the
// same two partial results, ordered by rank, so both get the same bits). MPICH's algorithms
// have the same property. tests/mpi/test_mpi_comm.cpp checks it byte for byte. If a future
// MPI broke this, MpiComm::allreduce_sum/max would have to become MPI_Reduce_scatter +
// MPI_Allgatherv (each element reduced on exactly one rank), which guarantees it by
// construction at the same bandwidth.
//
// Counts above INT_MAX (the MPI C API's count type) are split into chunks: blocking calls
// loop, non-blocking calls return one Request holding every chunk's MPI_Request. The
// reduce-scatter and allgather take a per-root path (MPI_Ireduce / MPI_Ibcast per block)
// when size()*n would not fit an int either, since MPI implementations compute that total
// internally.
#include "parallel/comm.h"

#include "ops/convert.h"
#include "parallel/watch.h"

// The C API only: without these, Open MPI's mpi.h pulls in its deprecated C++ bindings, whose
// symbols live in libmpi_cxx, which MPI::MPI_C does not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace parallel {

// Test hook: the largest count one MPI call is given (elements for typed calls, bytes for raw
// ones). INT_MAX in production; tests lower it to exercise the chunked paths with small
// buffers. Not in the header on purpose: tests declare it themselves.
namespace testing {
int64_t g_mpi_max_count = INT_MAX;
void set_mpi_max_count(int64_t n) { g_mpi_max_count = n > 0 ? std::min<int64_t>(n, INT_MAX) : INT_MAX; }
}  // namespace testing

namespace {

// ---------------------------------------------------------------------------------------
// SelfComm

class DoneRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class SelfComm final : public Communicator {
 public:
  using Communicator::iallreduce_sum;
  using Communicator::ireduce_scatter_sum;
  using Communicator::iallgather_inplace;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_max(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void allreduce_sum(int64_t*, int64_t) override {}
  void allreduce_min(int64_t*, int64_t) override {}
  void allreduce_max(int64_t*, int64_t) override {}
  std::unique_ptr<Request> iallreduce_sum(void*, ops::DType, int64_t) override { return std::make_unique<DoneRequest>(); }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    if (n > 0) std::memcpy(out, in, size_t(n) * ops::dtype_size(t));
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> iallgather_inplace(void*, ops::DType, int64_t) override { return std::make_unique<DoneRequest>(); }
  void allgather_inplace(float*, int64_t) override {}
  void broadcast(void*, size_t, int root) override {
    if (root != 0) throw std::invalid_argument("SelfComm::broadcast: root " + std::to_string(root) + " of 1 rank");
  }
  void send(const void*, size_t, int dst, int) override { no_p2p("send"); }
  void recv(void*, size_t, int src, int) override { no_p2p("recv"); }
  std::unique_ptr<Request> isend(const void*, size_t, int, int) override { no_p2p("isend"); }
  std::unique_ptr<Request> irecv(void*, size_t, int, int) override { no_p2p("irecv"); }
  void barrier() override {}
  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  std::unique_ptr<Communicator> split(int, int) override {
    auto c = self_comm();
    c->set_device(device_);
    return c;
  }

 private:
  [[noreturn]] static void no_p2p(const char* what) {
    throw std::logic_error(std::string("SelfComm::") + what + ": a one-rank communicator has no peer");
  }
};

// ---------------------------------------------------------------------------------------
// MPI helpers

std::atomic<CommFailureHandler> g_failure_handler{nullptr};

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  const std::string text = std::string(what) + " failed: " + std::string(msg, size_t(len));
  if (CommFailureHandler h = g_failure_handler.load()) h(text);
  throw std::runtime_error(text);
}

bool finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

// The chunks [off, off + c) that cover [0, n) with c <= the per-call limit.
template <class F>
void for_chunks(int64_t n, F&& f) {
  const int64_t lim = testing::g_mpi_max_count;
  if (n <= 0) {
    f(int64_t(0), 0);  // MPI accepts count 0; keep the collective call sequence uniform
    return;
  }
  for (int64_t off = 0; off < n; off += lim) f(off, int(std::min(lim, n - off)));
}

// A non-blocking call in flight. When traced, it reports its span once it is seen complete
// (by test(), wait() or the destructor), with the time spent in wait() as the exposed part.
class MpiRequest final : public Request {
 public:
  MpiRequest() = default;
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;
  ~MpiRequest() override {
    if (done_ || reqs_.empty() || finalized()) return;
    const int64_t t = sink_ ? ops::trace_now_ns() : 0;
    WaitMark mark(wait_);
    MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);  // no throwing here
    if (sink_) span_.wait_ns += ops::trace_now_ns() - t;
    complete();
  }
  std::vector<MPI_Request>& reqs() { return reqs_; }
  void trace(ops::TraceSink* sink, ops::TraceSpan span) {
    sink_ = sink;
    span_ = std::move(span);
  }
  // What a wait on this request is marked as for the watchdog (watch.h).
  void watch(const WaitInfo& w) { wait_ = w; }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (flag != 0) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    const int64_t t = sink_ ? ops::trace_now_ns() : 0;
    WaitMark mark(wait_);
    check(MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    if (sink_) span_.wait_ns += ops::trace_now_ns() - t;
    complete();
  }

 private:
  void complete() {
    done_ = true;
    if (!sink_) return;
    span_.t1_ns = ops::trace_now_ns();
    sink_->span(span_);
    sink_ = nullptr;
  }
  std::vector<MPI_Request> reqs_;
  bool done_ = false;
  ops::TraceSink* sink_ = nullptr;
  ops::TraceSpan span_;
  WaitInfo wait_;
};

// 16-bit sums: MPI has no bf16/fp16 type, so the elements travel as MPI_UINT16_T and a
// user-defined operation adds them in fp32 and rounds the result.
template <ops::DType T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kChunk = 1024;
  float a[kChunk], b[kChunk];
  auto* x = static_cast<const uint16_t*>(in);
  auto* y = static_cast<uint16_t*>(inout);
  for (int off = 0; off < *len; off += kChunk) {
    const int m = std::min(kChunk, *len - off);
    ops::to_f32(a, x + off, T, m);
    ops::to_f32(b, y + off, T, m);
    for (int k = 0; k < m; ++k) b[k] += a[k];
    ops::from_f32(y + off, T, b, m);
  }
}

struct Kind {
  MPI_Datatype type;
  MPI_Op sum;
  int64_t size;  // bytes per element
};

Kind kind_of(ops::DType t) {
  static MPI_Op bf16_sum = MPI_OP_NULL, f16_sum = MPI_OP_NULL;
  switch (t) {
    case ops::DType::F32: return {MPI_FLOAT, MPI_SUM, 4};
    case ops::DType::F64: return {MPI_DOUBLE, MPI_SUM, 8};  // small sums (the monitor's rows)
    case ops::DType::BF16:
      if (bf16_sum == MPI_OP_NULL) check(MPI_Op_create(&sum16<ops::DType::BF16>, 1, &bf16_sum), "MPI_Op_create");
      return {MPI_UINT16_T, bf16_sum, 2};
    case ops::DType::F16:
      if (f16_sum == MPI_OP_NULL) check(MPI_Op_create(&sum16<ops::DType::F16>, 1, &f16_sum), "MPI_Op_create");
      return {MPI_UINT16_T, f16_sum, 2};
    default: throw std::invalid_argument(std::string("collective over dtype ") + ops::dtype_name(t));
  }
}

// ---------------------------------------------------------------------------------------
// MpiComm

class MpiComm final : public Communicator {
 public:
  using Communicator::iallreduce_sum;
  using Communicator::ireduce_scatter_sum;
  using Communicator::iallgather_inplace;
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    find_world_ranks();
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm* handle() { return &comm_; }

  // What a wait for one call is marked as (watch.h): a collective takes the group's next
  // sequence number; a message names its peer by world rank.
  WaitInfo wait_info(CommOp op, int64_t bytes, int peer) {
    WaitInfo w;
    w.op = op;
    w.group = name_;
    w.ranks = ranks_;
    w.bytes = bytes;
    if (comm_op_p2p(op))
      w.peer = peer >= 0 && peer < size_ ? world_ranks_[static_cast<size_t>(peer)] : -1;
    else
      w.seq = ++seq_;
    return w;
  }

  // One blocking call: counted, marked for the watchdog, and reported as a span when traced.
  struct Blocking {
    MpiComm& c;
    WaitMark mark;
    ops::TraceSpan s;
    Blocking(MpiComm& comm, CommOp op, int64_t bytes, int peer = -1, int tag = -1)
        : c(comm), mark(comm.wait_info(op, bytes, peer)) {
      c.counts_[static_cast<size_t>(op)]++;
      if (!c.trace_) return;
      s = c.span(op, bytes, peer, tag);
    }
    ~Blocking() {
      if (!c.trace_) return;
      s.t1_ns = ops::trace_now_ns();
      c.trace_->span(s);
    }
  };
  // One non-blocking call: counted, and its request reports its span when it completes.
  std::unique_ptr<MpiRequest> launched(CommOp op, int64_t bytes, int peer = -1, int tag = -1) {
    counts_[static_cast<size_t>(op)]++;
    auto r = std::make_unique<MpiRequest>();
    r->watch(wait_info(op, bytes, peer));
    if (trace_) {
      ops::TraceSpan sp = span(op, bytes, peer, tag);
      sp.async = true;
      r->trace(trace_, std::move(sp));
    }
    return r;
  }
  ops::TraceSpan span(CommOp op, int64_t bytes, int peer, int tag) const {
    ops::TraceSpan sp;
    sp.name = comm_op_name(op);
    sp.cat = comm_op_p2p(op) ? "p2p" : "comm";
    sp.group = name_;
    sp.bytes = bytes;
    sp.peer = peer;
    sp.tag = tag;
    sp.mark = trace_->mark();
    sp.t0_ns = ops::trace_now_ns();
    return sp;
  }

  void allreduce_sum(float* x, int64_t n) override { allreduce(x, n, MPI_FLOAT, MPI_SUM); }
  void allreduce_max(float* x, int64_t n) override { allreduce(x, n, MPI_FLOAT, MPI_MAX); }
  void allreduce_sum(double* x, int64_t n) override { allreduce(x, n, MPI_DOUBLE, MPI_SUM); }
  void allreduce_sum(int64_t* x, int64_t n) override { allreduce(x, n, MPI_INT64_T, MPI_SUM); }
  void allreduce_min(int64_t* x, int64_t n) override { allreduce(x, n, MPI_INT64_T, MPI_MIN); }
  void allreduce_max(int64_t* x, int64_t n) override { allreduce(x, n, MPI_INT64_T, MPI_MAX); }

  std::unique_ptr<Request> iallreduce_sum(void* xv, ops::DType t, int64_t n) override {
    const Kind k = kind_of(t);
    char* x = static_cast<char*>(xv);
    auto r = launched(CommOp::Iallreduce, n * k.size);
    for_chunks(n, [&](int64_t off, int c) {
      MPI_Request q;
      check(MPI_Iallreduce(MPI_IN_PLACE, x + off * k.size, c, k.type, k.sum, comm_, &q), "MPI_Iallreduce");
      r->reqs().push_back(q);
    });
    return r;
  }

  std::unique_ptr<Request> ireduce_scatter_sum(const void* inv, void* outv, ops::DType t, int64_t n) override {
    const Kind k = kind_of(t);
    const char* in = static_cast<const char*>(inv);
    char* out = static_cast<char*>(outv);
    auto r = launched(CommOp::IreduceScatter, n * size_ * k.size);
    if (fits(n * size_)) {
      MPI_Request q;
      check(MPI_Ireduce_scatter_block(in, out, int(n), k.type, k.sum, comm_, &q), "MPI_Ireduce_scatter_block");
      r->reqs().push_back(q);
      return r;
    }
    // Huge blocks: reduce chunk [off, off+c) of every rank's block b onto rank b.
    for_chunks(n, [&](int64_t off, int c) {
      for (int b = 0; b < size_; ++b) {
        MPI_Request q;
        check(MPI_Ireduce(in + (int64_t(b) * n + off) * k.size, b == rank_ ? out + off * k.size : nullptr, c, k.type,
                          k.sum, b, comm_, &q),
              "MPI_Ireduce");
        r->reqs().push_back(q);
      }
    });
    return r;
  }

  std::unique_ptr<Request> iallgather_inplace(void* bufv, ops::DType t, int64_t n) override {
    return iallgather(bufv, t, n, launched(CommOp::Iallgather, n * size_ * kind_of(t).size));
  }
  std::unique_ptr<Request> iallgather(void* bufv, ops::DType t, int64_t n, std::unique_ptr<MpiRequest> r) {
    const Kind k = kind_of(t);
    char* buf = static_cast<char*>(bufv);
    if (fits(n * size_)) {
      MPI_Request q;
      check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, int(n), k.type, comm_, &q), "MPI_Iallgather");
      r->reqs().push_back(q);
      return r;
    }
    for_chunks(n, [&](int64_t off, int c) {
      for (int b = 0; b < size_; ++b) {
        MPI_Request q;
        check(MPI_Ibcast(buf + (int64_t(b) * n + off) * k.size, c, k.type, b, comm_, &q), "MPI_Ibcast");
        r->reqs().push_back(q);
      }
    });
    return r;
  }

  void allgather_inplace(float* buf, int64_t n) override {
    Blocking b(*this, CommOp::Allgather, n * size_ * int64_t(sizeof(float)));
    if (fits(n * size_)) {
      check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, int(n), MPI_FLOAT, comm_), "MPI_Allgather");
      return;
    }
    iallgather(buf, ops::DType::F32, n, std::make_unique<MpiRequest>())->wait();
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    Blocking b(*this, CommOp::Broadcast, int64_t(bytes), root);
    char* p = static_cast<char*>(buf);
    for_chunks(int64_t(bytes), [&](int64_t off, int c) {
      check(MPI_Bcast(p + off, c, MPI_BYTE, root, comm_), "MPI_Bcast");
    });
  }

  // Point-to-point: a message above the limit travels as several messages with the same tag;
  // MPI's non-overtaking rule matches them in order.
  void send(const void* buf, size_t bytes, int dst, int tag) override {
    Blocking b(*this, CommOp::Send, int64_t(bytes), dst, tag);
    const char* p = static_cast<const char*>(buf);
    for_chunks(int64_t(bytes), [&](int64_t off, int c) {
      check(MPI_Send(p + off, c, MPI_BYTE, dst, tag, comm_), "MPI_Send");
    });
  }
  void recv(void* buf, size_t bytes, int src, int tag) override {
    Blocking b(*this, CommOp::Recv, int64_t(bytes), src, tag);
    char* p = static_cast<char*>(buf);
    for_chunks(int64_t(bytes), [&](int64_t off, int c) {
      check(MPI_Recv(p + off, c, MPI_BYTE, src, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    });
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) override {
    auto r = launched(CommOp::Isend, int64_t(bytes), dst, tag);
    const char* p = static_cast<const char*>(buf);
    for_chunks(int64_t(bytes), [&](int64_t off, int c) {
      MPI_Request q;
      check(MPI_Isend(p + off, c, MPI_BYTE, dst, tag, comm_, &q), "MPI_Isend");
      r->reqs().push_back(q);
    });
    return r;
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) override {
    auto r = launched(CommOp::Irecv, int64_t(bytes), src, tag);
    char* p = static_cast<char*>(buf);
    for_chunks(int64_t(bytes), [&](int64_t off, int c) {
      MPI_Request q;
      check(MPI_Irecv(p + off, c, MPI_BYTE, src, tag, comm_, &q), "MPI_Irecv");
      r->reqs().push_back(q);
    });
    return r;
  }

  void barrier() override {
    Blocking b(*this, CommOp::Barrier, 0);
    check(MPI_Barrier(comm_), "MPI_Barrier");
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) throw std::invalid_argument("MpiComm::split: negative color " + std::to_string(color));
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    auto c = std::make_unique<MpiComm>(sub);
    c->set_device(device_);
    return c;
  }

 private:
  static bool fits(int64_t n) { return n <= testing::g_mpi_max_count; }

  // The members' world ranks, once: for naming a message's peer and the group's members.
  void find_world_ranks() {
    MPI_Group world = MPI_GROUP_NULL, mine = MPI_GROUP_NULL;
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
    check(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
    std::vector<int> local(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) local[static_cast<size_t>(i)] = i;
    world_ranks_.assign(static_cast<size_t>(size_), -1);
    check(MPI_Group_translate_ranks(mine, size_, local.data(), world, world_ranks_.data()), "MPI_Group_translate_ranks");
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    ranks_ = {world_ranks_[0], size_ > 1 ? world_ranks_[1] - world_ranks_[0] : 1, size_};
    for (int i = 0; i < size_; ++i)
      if (world_ranks_[static_cast<size_t>(i)] != ranks_.world_rank(i)) ranks_.stride = 0;  // not a progression
  }

  void allreduce(void* x, int64_t n, MPI_Datatype t, MPI_Op op) {
    int sz = 0;
    check(MPI_Type_size(t, &sz), "MPI_Type_size");
    Blocking b(*this, CommOp::Allreduce, n * sz);
    char* p = static_cast<char*>(x);
    for_chunks(n, [&](int64_t off, int c) {
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * sz, c, t, op, comm_), "MPI_Allreduce");
    });
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // member i's world rank
  GroupRanks ranks_;
  int64_t seq_ = 0;  // collectives called so far (the same on every member: MPI's ordering rule)
};

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

}  // namespace

std::unique_ptr<Communicator> self_comm() { return std::make_unique<SelfComm>(); }

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::Allreduce: return "allreduce";
    case CommOp::Iallreduce: return "iallreduce";
    case CommOp::IreduceScatter: return "ireduce_scatter";
    case CommOp::Iallgather: return "iallgather";
    case CommOp::Allgather: return "allgather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::Send: return "send";
    case CommOp::Recv: return "recv";
    case CommOp::Isend: return "isend";
    case CommOp::Irecv: return "irecv";
    case CommOp::Barrier: return "barrier";
    case CommOp::Count: break;
  }
  return "?";
}

bool comm_op_p2p(CommOp op) {
  return op == CommOp::Send || op == CommOp::Recv || op == CommOp::Isend || op == CommOp::Irecv;
}

bool mpi_launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (env_set(v)) return true;
  // Slurm sets SLURM_PROCID in batch scripts too; only a step started by srun has task counts.
  return env_set("SLURM_PROCID") && (env_set("SLURM_NTASKS") || env_set("SLURM_STEP_NUM_TASKS"));
}

bool mpi_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  return init != 0 && !finalized();
}

void init_mpi(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = MPI_THREAD_SINGLE;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_FUNNELED)
    std::fprintf(stderr, "warning: MPI provides thread level %d < MPI_THREAD_FUNNELED; OpenMP threads never call MPI\n",
                 provided);
}

void set_comm_failure_handler(CommFailureHandler h) { g_failure_handler.store(h); }

void finalize_mpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (init && !finalized()) MPI_Finalize();
}

std::unique_ptr<Communicator> mpi_world() {
  if (!mpi_initialized()) throw std::logic_error("mpi_world: MPI is not initialised (call init_mpi first)");
  return std::make_unique<MpiComm>(MPI_COMM_WORLD);
}

void* mpi_handle(Communicator& c) {
  auto* m = dynamic_cast<MpiComm*>(&c);
  return m ? static_cast<void*>(m->handle()) : nullptr;
}

void Communicator::allgather(const float* in, float* out, int64_t n) {
  if (n > 0 && out + static_cast<int64_t>(rank()) * n != in)
    std::memmove(out + static_cast<int64_t>(rank()) * n, in, static_cast<size_t>(n) * sizeof(float));
  allgather_inplace(out, n);
}

void Communicator::reduce_scatter_sum(const float* in, float* out, int64_t n) {
  if (size() == 1) {
    if (out != in) std::memmove(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  ireduce_scatter_sum(in, out, n)->wait();
}

}  // namespace parallel
