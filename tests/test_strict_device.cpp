// The strict CPU device itself (ops/strict/strict_backend.h), the checking device every
// `NAME_strict` test runs on: that it is as strict as it claims and as exact as the CPU.
//   - host code that reads or writes a device tensor dies of SIGSEGV, saying so;
//   - a kernel given a host pointer throws std::logic_error (at the call);
//   - copy_out's destination is poisoned (0xFF) until synchronize(), right after;
//   - calls run in the order they were made; freed memory is reused only after the work
//     queued before the free (stream order); a queued kernel's exception comes back at
//     synchronize();
//   - every Backend kernel equals the CPU backend's bit for bit on random inputs: one table
//     (like test_ops_table.cpp's for the operators), and a check that it names every kernel
//     ops/backend.h declares, so a kernel added there without an entry here fails;
//   - the MemoryTracker counts a device tensor's bytes as a host tensor's.
// The "queue still busy" cases put a long GEMM in front of the call they look at: the device
// runs it for a good fraction of a second, while the host looks at once.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/strict/strict_backend.h"
#include "ops/tensor.h"

using ops::Account;
using ops::Backend;
using ops::DType;
using ops::Tensor;

namespace {

Backend& strict() { return ops::strict::strict_backend(); }

// A device tensor of n floats holding `v` (one crossing in).
Tensor device_floats(const std::vector<float>& v) {
  Tensor t({static_cast<int64_t>(v.size())}, DType::F32, Account::Workspace, false, &strict());
  t.write_from_host(v.data());
  return t;
}

// Keeps the device's queue busy for a while: a chain of GEMMs over device memory (~0.5 s).
struct Blocker {
  static constexpr int kN = 768;
  Tensor a, w, out;
  Blocker()
      : a({kN, kN}, DType::F32, Account::Workspace, false, &strict()),
        w({kN, kN}, DType::F32, Account::Workspace, false, &strict()),
        out({kN, kN}, DType::F32, Account::Workspace, false, &strict()) {
    strict().run(ops::k::Fill(a.raw(), DType::F32, 0.5f, a.numel()));
    strict().run(ops::k::Fill(w.raw(), DType::F32, 0.25f, w.numel()));
  }
  void queue(int gemms = 12) {
    for (int i = 0; i < gemms; ++i) strict().run(ops::k::MatmulForward(out.data<float>(), a.data<float>(), w.data<float>(), nullptr, kN, kN, kN));
  }
};

// Runs `touch` in a child process (stderr into a pipe); its exit status as the shell says it
// (128 + signal) and what it wrote on stderr.
std::pair<int, std::string> in_child(const std::function<void()>& touch) {
  strict().synchronize();  // the queue idle: the child inherits no lock held mid-call
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    // doctest's own crash report (its handler takes the signal after the device's) stays out
    // of the parent's output.
    if (FILE* null = std::fopen("/dev/null", "w")) dup2(fileno(null), 1);
    touch();
    _exit(0);  // survived: the parent's check fails
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status), err};
}

const char* kTouched = "strict device: host code touched device memory";

}  // namespace

TEST_CASE("strict device: a host read or write of a device tensor dies of SIGSEGV, saying so") {
  for (const bool write : {false, true}) {
    CAPTURE(write);
    auto [code, err] = in_child([write] {
      Tensor t({64}, DType::F32, Account::Activations, false, &strict());
      volatile float* p = t.data<float>();
      if (write) p[3] = 1.0f;
      else (void)p[3];
    });
    INFO(err);
    CHECK(code == 128 + SIGSEGV);
    CHECK(err.find(kTouched) != std::string::npos);
    CHECK(err.find("Backtrace:") != std::string::npos);
  }
  // A fault elsewhere is not blamed on the device: no message, the plain SIGSEGV.
  auto [code, err] = in_child([] {
    volatile int* p = nullptr;
    *p = 1;
  });
  CHECK(code == 128 + SIGSEGV);
  CHECK(err.find(kTouched) == std::string::npos);
  // The checked host accessor refuses before touching.
  Tensor t({4}, DType::F32, Account::Activations, true, &strict());
  CHECK(!t.on_host());
  CHECK_THROWS_AS(t.host_data<float>(), std::logic_error);
}

TEST_CASE("strict device: a kernel given a host pointer throws std::logic_error at the call") {
  Backend& be = strict();
  std::vector<float> host(16, 1.0f);
  Tensor dev = device_floats(host);
  CHECK_THROWS_AS(be.run(ops::k::Scale(host.data(), 16, 2.0f)), std::logic_error);
  CHECK_THROWS_AS(be.run(ops::k::AddInplace(dev.data<float>(), host.data(), 16)), std::logic_error);
  CHECK_THROWS_AS(be.copy(dev.raw(), host.data(), 64), std::logic_error);
  CHECK_THROWS_AS(be.mem_zero(host.data(), 64), std::logic_error);
  // The crossings take the host side only where the host belongs.
  CHECK_THROWS_AS(be.copy_in(dev.raw(), dev.raw(), 64), std::logic_error);
  CHECK_THROWS_AS(be.copy_out(dev.raw(), dev.raw(), 64), std::logic_error);
  be.synchronize();  // nothing was queued by the refused calls
  std::vector<float> back(16);
  dev.read_to_host(back.data());
  CHECK(back == host);
}

TEST_CASE("strict device: copy_out's destination is poison until synchronize(), the values after") {
  Blocker blocker;
  const std::vector<float> want = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  Tensor t = device_floats(want);
  blocker.queue();
  std::vector<float> got(want.size(), 42.0f);
  strict().copy_out(got.data(), t.raw(), t.nbytes());
  std::vector<unsigned char> bytes(t.nbytes());
  std::memcpy(bytes.data(), got.data(), bytes.size());
  for (unsigned char b : bytes) CHECK(b == 0xFF);  // NaN as floats: a read that forgot to wait is wrong
  CHECK(std::isnan(got[0]));
  strict().synchronize();
  CHECK(got == want);
  // Tensor::read_to_host waits: right at once.
  std::vector<float> again(want.size());
  blocker.queue(2);
  t.read_to_host(again.data());
  CHECK(again == want);
}

TEST_CASE("strict device: calls run in the order they are made (zero, fill, accumulate, copies)") {
  Backend& be = strict();
  const int64_t n = 1000;
  Blocker blocker;
  blocker.queue(2);  // everything below waits behind it, in order
  Tensor a({n}, DType::F32, Account::Workspace, false, &be), b({n}, DType::F32, Account::Workspace, false, &be),
      c({n}, DType::F32, Account::Workspace, false, &be), h({n}, DType::BF16, Account::Workspace, false, &be);
  std::vector<float> ones(n, 1.0f);
  be.run(ops::k::Fill(a.raw(), DType::F32, 7.0f, n));  // overwritten by the zero after it
  be.mem_zero(a.raw(), a.nbytes());
  be.run(ops::k::Fill(b.raw(), DType::F32, 3.0f, n));
  b.write_from_host(ones.data());          // b = 1 (the copy in is queued like a kernel)
  be.run(ops::k::Accumulate(a.raw(), DType::F32, b.data<float>(), n));  // a = 1
  be.run(ops::k::Accumulate(a.raw(), DType::F32, b.data<float>(), n));  // a = 2
  be.copy(c.raw(), a.raw(), a.nbytes());                   // c = 2
  be.run(ops::k::Scale(c.data<float>(), n, 2.5f));                      // c = 5
  be.run(ops::k::Convert(h.raw(), DType::BF16, c.raw(), DType::F32, n));  // h = bf16(5)
  be.run(ops::k::Accumulate(h.raw(), DType::BF16, b.data<float>(), n));   // h = 6
  be.run(ops::k::Convert(c.raw(), DType::F32, h.raw(), DType::BF16, n));  // c = 6
  be.run(ops::k::AddInplace(c.data<float>(), a.data<float>(), n));       // c = 8
  std::vector<float> got(n);
  c.read_to_host(got.data());
  for (float v : got) REQUIRE(v == 8.0f);
  CHECK(ops::sum_squares(be, c.data<float>(), n) == 64.0 * n);
  CHECK(ops::sum_squares_typed(be, h.raw(), DType::BF16, n) == 36.0 * n);
}

TEST_CASE("strict device: freed memory is reused only after the work queued before the free") {
  Backend& be = strict();
  const size_t bytes = 4096 * 64 + 64;  // a size no other test uses: the cache holds none
  Blocker blocker;
  void* p1 = be.mem_alloc(bytes);
  blocker.queue();
  be.mem_zero(p1, bytes);  // still to run when the free below is made
  be.mem_free(p1, bytes);
  void* p2 = be.mem_alloc(bytes);
  CHECK(p2 != p1);  // p1 is not free yet: its zeroing has not run
  be.synchronize();
  be.mem_free(p2, bytes);
  be.synchronize();
  void* p3 = be.mem_alloc(bytes);
  void* p4 = be.mem_alloc(bytes);
  CHECK(std::set<void*>{p3, p4} == std::set<void*>{p1, p2});  // both came back to the cache
  be.mem_free(p3, bytes);
  be.mem_free(p4, bytes);
  be.synchronize();
}

TEST_CASE("strict device: a queued kernel's exception is rethrown at synchronize(), and the device goes on") {
  Backend& be = strict();
  Tensor a = device_floats({1, 2, 3, 4});
  Tensor b = device_floats({0, 0, 0, 0});
  const size_t bytes = 4096 * 64 + 128;
  void* p = be.mem_alloc(bytes);
  be.run(ops::k::Convert(b.raw(), DType::F32, a.raw(), DType::I32, 4));  // not a float format: throws on the queue
  be.copy(b.raw(), a.raw(), a.nbytes());                    // dropped after the error
  be.mem_free(p, bytes);                                    // but memory still comes back
  CHECK_THROWS_AS(be.synchronize(), std::logic_error);
  be.synchronize();  // reported once
  std::vector<float> got(4);
  b.read_to_host(got.data());
  CHECK(got == std::vector<float>{0, 0, 0, 0});
  void* q = be.mem_alloc(bytes);
  CHECK(q == p);
  be.mem_free(q, bytes);
  be.copy(b.raw(), a.raw(), a.nbytes());
  b.read_to_host(got.data());
  CHECK(got == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("strict device: the MemoryTracker counts device tensors' bytes as host tensors'") {
  auto& mt = ops::MemoryTracker::instance();
  for (const DType dt : {DType::F32, DType::BF16, DType::I32, DType::I8}) {
    CAPTURE(ops::dtype_name(dt));
    const size_t before = mt.current(Account::Activations);
    size_t host_bytes = 0;
    {
      Tensor h = Tensor::host({37, 3}, dt, Account::Activations);
      host_bytes = mt.current(Account::Activations) - before;
      CHECK(host_bytes == 37 * 3 * ops::dtype_size(dt));
      Tensor d({37, 3}, dt, Account::Activations, true, &strict());
      CHECK(mt.current(Account::Activations) - before == 2 * host_bytes);
      Tensor c = d.clone(Account::Activations);  // on the same device
      CHECK(c.device() == &strict());
      CHECK(mt.current(Account::Activations) - before == 3 * host_bytes);
    }
    CHECK(mt.current(Account::Activations) == before);  // freed (the block returns when its work is done)
  }
  strict().synchronize();
}

// ---- every kernel, strict against the CPU, bit for bit ----

namespace {

// One buffer of a kernel case: n elements of dt, random in [lo, hi] (integers: whole numbers
// in it; 16-bit floats: the fp32 draw rounded).
struct Buf {
  int64_t n;
  DType dt;
  float lo = -1.0f, hi = 1.0f;
};

// A call of one Backend method over the case's buffers (device pointers on the strict device,
// host pointers on the CPU); the value it returns (sum_squares*) or 0.
using Call = std::function<double(Backend&, const std::vector<void*>&)>;

struct KernelCase {
  std::string method;  // the Backend method it calls (the coverage check reads it)
  std::string name;
  std::vector<Buf> bufs;
  Call call;
};

std::vector<char> random_bytes(const Buf& b, std::mt19937& rng) {
  std::vector<char> out(static_cast<size_t>(b.n) * ops::dtype_size(b.dt));
  std::uniform_real_distribution<float> u(b.lo, b.hi);
  std::vector<float> f(static_cast<size_t>(b.n));
  for (float& x : f) x = u(rng);
  switch (b.dt) {
    case DType::F32: std::memcpy(out.data(), f.data(), out.size()); break;
    case DType::BF16:
    case DType::F16: ops::from_f32(out.data(), b.dt, f.data(), b.n); break;
    case DType::I32:
      for (int64_t i = 0; i < b.n; ++i) reinterpret_cast<int32_t*>(out.data())[i] = static_cast<int32_t>(std::floor(f[static_cast<size_t>(i)]));
      break;
    case DType::I8:
      for (int64_t i = 0; i < b.n; ++i) out[static_cast<size_t>(i)] = static_cast<char>(static_cast<int>(std::floor(f[static_cast<size_t>(i)])));
      break;
    default: FAIL("no random data for this dtype");
  }
  return out;
}

// Runs `c` on both backends from the same inputs: every buffer's bytes and the result equal.
void check_bit_identical(const KernelCase& c, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<char>> init;
  for (const Buf& b : c.bufs) init.push_back(random_bytes(b, rng));
  std::vector<std::vector<char>> cpu = init;
  std::vector<void*> hp;
  for (auto& v : cpu) hp.push_back(v.data());
  const double cpu_result = c.call(ops::cpu_backend(), hp);
  std::vector<Tensor> dev;
  std::vector<void*> dp;
  for (size_t i = 0; i < c.bufs.size(); ++i) {
    dev.emplace_back(std::vector<int64_t>{c.bufs[i].n}, c.bufs[i].dt, Account::Workspace, false, &strict());
    dev.back().write_from_host(init[i].data());
    dp.push_back(dev.back().raw());
  }
  const double strict_result = c.call(strict(), dp);
  for (size_t i = 0; i < c.bufs.size(); ++i) {
    CAPTURE(i);
    std::vector<char> back(init[i].size());
    dev[i].read_to_host(back.data());
    CHECK(std::memcmp(back.data(), cpu[i].data(), back.size()) == 0);
  }
  CHECK(std::memcmp(&strict_result, &cpu_result, sizeof(double)) == 0);
}

float* F(const std::vector<void*>& p, size_t i) { return static_cast<float*>(p[i]); }
int32_t* I(const std::vector<void*>& p, size_t i) { return static_cast<int32_t*>(p[i]); }

// Shapes: B batch, T positions, NH query heads over NKV key-value heads of HS channels.
constexpr int B = 2, T = 5, N = B * T, C = 8, V = 11, Vp = 12, H = 6, OC = 7;
constexpr int NH = 4, NKV = 2, HS = 4, CQ = NH * HS, W = (NH + 2 * NKV) * HS;
constexpr int64_t kBig = 100003;  // over every kernel's threshold for going parallel
const ops::Heads kGqa = ops::Heads::grouped(NH, NKV);
const ops::Heads kMha = ops::Heads(2);  // 2 heads of HS 4 over C = 8: W = 24

std::vector<KernelCase> memory_and_generic_cases() {
  std::vector<KernelCase> cs;
  cs.push_back({"mem_zero", "mem_zero", {{1000, DType::F32}}, [](Backend& be, const auto& p) {
                  be.mem_zero(p[0], 1000 * 4);
                  return 0.0;
                }});
  cs.push_back({"copy", "copy", {{1000, DType::F32}, {1000, DType::F32}}, [](Backend& be, const auto& p) {
                  be.copy(p[0], p[1], 1000 * 4);
                  return 0.0;
                }});
  for (auto [dt, st] : std::vector<std::pair<DType, DType>>{
           {DType::BF16, DType::F32}, {DType::F32, DType::F16}, {DType::F16, DType::BF16}, {DType::F32, DType::F32}})
    cs.push_back({"convert", std::string("convert ") + ops::dtype_name(st) + " -> " + ops::dtype_name(dt),
                  {{kBig, dt}, {kBig, st, -300.0f, 300.0f}}, [dt, st](Backend& be, const auto& p) {
                    be.run(ops::k::Convert(p[0], dt, p[1], st, kBig));
                    return 0.0;
                  }});
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    cs.push_back({"accumulate", std::string("accumulate into ") + ops::dtype_name(dt), {{kBig, dt}, {kBig, DType::F32}},
                  [dt](Backend& be, const auto& p) {
                    be.run(ops::k::Accumulate(p[0], dt, F(p, 1), kBig));
                    return 0.0;
                  }});
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    cs.push_back({"sum_squares_typed", std::string("sum_squares_typed ") + ops::dtype_name(dt), {{kBig, dt}},
                  [dt](Backend& be, const auto& p) { return ops::sum_squares_typed(be, p[0], dt, kBig); }});
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    cs.push_back({"fill", std::string("fill ") + ops::dtype_name(dt), {{1001, dt}}, [dt](Backend& be, const auto& p) {
                    be.run(ops::k::Fill(p[0], dt, -0.3f, 1001));
                    return 0.0;
                  }});
  cs.push_back({"sum_squares", "sum_squares", {{kBig, DType::F32}},
                [](Backend& be, const auto& p) { return ops::sum_squares(be, F(p, 0), kBig); }});
  cs.push_back({"scale", "scale", {{kBig, DType::F32}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::Scale(F(p, 0), kBig, 0.7f));
                  return 0.0;
                }});
  cs.push_back({"add_forward", "add_forward", {{kBig, DType::F32}, {kBig, DType::F32}, {kBig, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AddForward(F(p, 0), F(p, 1), F(p, 2), kBig));
                  return 0.0;
                }});
  cs.push_back({"add_inplace", "add_inplace", {{kBig, DType::F32}, {kBig, DType::F32}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::AddInplace(F(p, 0), F(p, 1), kBig));
                  return 0.0;
                }});
  cs.push_back({"adamw_update", "adamw_update",
                {{kBig, DType::F32}, {kBig, DType::F32}, {kBig, DType::F32}, {kBig, DType::F32, 0.0f, 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AdamwUpdate(F(p, 0), F(p, 1), F(p, 2), F(p, 3), kBig, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f));
                  return 0.0;
                }});
  for (auto [pt, gt, master] : std::vector<std::tuple<DType, DType, bool>>{
           {DType::F32, DType::F32, false}, {DType::BF16, DType::BF16, true}, {DType::F16, DType::F32, false}}) {
    std::vector<Buf> bufs = {{kBig, pt}, {kBig, gt}, {master ? kBig : 1, DType::F32}, {kBig, DType::F32}, {kBig, DType::F32, 0.0f, 0.01f}};
    cs.push_back({"adamw_update_typed",
                  std::string("adamw_update_typed ") + ops::dtype_name(pt) + " / " + ops::dtype_name(gt) + (master ? " with masters" : ""),
                  bufs, [pt, gt, master](Backend& be, const auto& p) {
                    Backend::AdamwArgs a;
                    a.lr = 1e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f, a.t = 3, a.grad_scale = 0.5f;
                    be.run(ops::k::AdamwUpdateTyped(p[0], pt, p[1], gt, master ? F(p, 2) : nullptr, F(p, 3), F(p, 4), kBig, a));
                    return 0.0;
                  }});
    // The one-pass update: the same state, and the gradient zeroed.
    cs.push_back({"adamw_update_zero_grad",
                  std::string("adamw_update_zero_grad ") + ops::dtype_name(pt) + " / " + ops::dtype_name(gt) + (master ? " with masters" : ""),
                  bufs, [pt, gt, master](Backend& be, const auto& p) {
                    Backend::AdamwArgs a;
                    a.lr = 1e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f, a.t = 3, a.grad_scale = 0.5f;
                    be.run(ops::k::AdamwUpdateZeroGrad(p[0], pt, p[1], gt, master ? F(p, 2) : nullptr, F(p, 3), F(p, 4), kBig, a));
                    return 0.0;
                  }});
  }
  return cs;
}

std::vector<KernelCase> pointwise_and_norm_cases() {
  std::vector<KernelCase> cs;
  const ops::DropoutSpec drop{0.2f, 1234, 77};
  cs.push_back({"gelu_forward", "gelu_forward", {{kBig, DType::F32}, {kBig, DType::F32, -6, 6}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::GeluForward(F(p, 0), F(p, 1), kBig));
                  return 0.0;
                }});
  cs.push_back({"gelu_backward", "gelu_backward", {{kBig, DType::F32}, {kBig, DType::F32, -6, 6}, {kBig, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::GeluBackward(F(p, 0), F(p, 1), F(p, 2), kBig));
                  return 0.0;
                }});
  cs.push_back({"relu2_forward", "relu2_forward", {{kBig, DType::F32}, {kBig, DType::F32, -6, 6}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::Relu2Forward(F(p, 0), F(p, 1), kBig));
                  return 0.0;
                }});
  cs.push_back({"relu2_backward", "relu2_backward", {{kBig, DType::F32}, {kBig, DType::F32, -6, 6}, {kBig, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::Relu2Backward(F(p, 0), F(p, 1), F(p, 2), kBig));
                  return 0.0;
                }});
  cs.push_back({"swiglu_forward", "swiglu_forward", {{N * H, DType::F32}, {N * 2 * H, DType::F32, -4, 4}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::SwigluForward(F(p, 0), F(p, 1), N, H));
                  return 0.0;
                }});
  cs.push_back({"swiglu_backward", "swiglu_backward", {{N * 2 * H, DType::F32}, {N * H, DType::F32}, {N * 2 * H, DType::F32, -4, 4}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::SwigluBackward(F(p, 0), F(p, 1), F(p, 2), N, H));
                  return 0.0;
                }});
  cs.push_back({"dropout_forward", "dropout_forward", {{kBig, DType::F32}, {kBig, DType::F32}}, [drop](Backend& be, const auto& p) {
                  be.run(ops::k::DropoutForward(F(p, 0), F(p, 1), kBig, drop));
                  return 0.0;
                }});
  cs.push_back({"dropout_backward", "dropout_backward", {{kBig, DType::F32}, {kBig, DType::F32}}, [drop](Backend& be, const auto& p) {
                  be.run(ops::k::DropoutBackward(F(p, 0), F(p, 1), kBig, drop));
                  return 0.0;
                }});
  cs.push_back({"layernorm_forward", "layernorm_forward",
                {{N * C, DType::F32}, {N, DType::F32}, {N, DType::F32}, {N * C, DType::F32, -3, 3}, {C, DType::F32}, {C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::LayerNormForward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), N, C, 1e-5f));
                  return 0.0;
                }});
  cs.push_back({"layernorm_backward", "layernorm_backward",
                {{N * C, DType::F32}, {C, DType::F32}, {C, DType::F32}, {N * C, DType::F32}, {N * C, DType::F32},
                 {C, DType::F32}, {N, DType::F32}, {N, DType::F32, 0.5f, 2.0f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::LayerNormBackward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), F(p, 6), F(p, 7), N, C));
                  return 0.0;
                }});
  cs.push_back({"rmsnorm_forward", "rmsnorm_forward", {{N * C, DType::F32}, {N, DType::F32}, {N * C, DType::F32, -3, 3}, {C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::RmsNormForward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), N, C, 1e-6f));
                  return 0.0;
                }});
  cs.push_back({"rmsnorm_backward", "rmsnorm_backward",
                {{N * C, DType::F32}, {C, DType::F32}, {N * C, DType::F32}, {N * C, DType::F32}, {C, DType::F32},
                 {N, DType::F32, 0.5f, 2.0f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::RmsNormBackward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), N, C));
                  return 0.0;
                }});
  // A residual add and its norm: sum, y, statistics; then d(a), d(b), the weight
  // gradients, d(sum) turned into the total in place, from d(y), the sum and the statistics.
  cs.push_back({"add_layernorm_forward", "add_layernorm_forward",
                {{N * C, DType::F32}, {N * C, DType::F32}, {N, DType::F32}, {N, DType::F32}, {N * C, DType::F32, -3, 3},
                 {N * C, DType::F32, -3, 3}, {C, DType::F32}, {C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AddLayerNormForward(p[0], p[1], F(p, 2), F(p, 3), p[4], p[5], F(p, 6), F(p, 7), N, C,
                                           1e-5f), DType::F32);
                  return 0.0;
                }});
  cs.push_back({"add_layernorm_backward", "add_layernorm_backward",
                {{N * C, DType::F32}, {N * C, DType::F32}, {C, DType::F32}, {C, DType::F32}, {N * C, DType::F32},
                 {N * C, DType::F32}, {N * C, DType::F32}, {C, DType::F32}, {N, DType::F32}, {N, DType::F32, 0.5f, 2.0f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AddLayerNormBackward(p[0], p[1], F(p, 2), F(p, 3), p[4], p[5], p[6], F(p, 7), F(p, 8), F(p, 9), N, C), DType::F32);
                  return 0.0;
                }});
  cs.push_back({"add_rmsnorm_forward", "add_rmsnorm_forward",
                {{N * C, DType::F32}, {N * C, DType::F32}, {N, DType::F32}, {N * C, DType::F32, -3, 3},
                 {N * C, DType::F32, -3, 3}, {C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AddRmsNormForward(p[0], p[1], F(p, 2), p[3], p[4], F(p, 5), N, C, 1e-6f), DType::F32);
                  return 0.0;
                }});
  cs.push_back({"add_rmsnorm_backward", "add_rmsnorm_backward",
                {{N * C, DType::F32}, {N * C, DType::F32}, {C, DType::F32}, {N * C, DType::F32}, {N * C, DType::F32},
                 {N * C, DType::F32}, {C, DType::F32}, {N, DType::F32, 0.5f, 2.0f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::AddRmsNormBackward(p[0], p[1], F(p, 2), p[3], p[4], p[5], F(p, 6), F(p, 7), N, C), DType::F32);
                  return 0.0;
                }});
  return cs;
}

std::vector<KernelCase> embedding_and_loss_cases() {
  std::vector<KernelCase> cs;
  cs.push_back({"embedding_forward", "embedding_forward",
                {{N * C, DType::F32}, {N, DType::I32, 0, V - 0.01f}, {V * C, DType::F32}, {T * C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::EmbeddingForward(F(p, 0), I(p, 1), F(p, 2), F(p, 3), B, T, C));
                  return 0.0;
                }});
  cs.push_back({"embedding_backward", "embedding_backward",
                {{V * C, DType::F32}, {T * C, DType::F32}, {N * C, DType::F32}, {N, DType::I32, 0, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::EmbeddingBackward(F(p, 0), F(p, 1), F(p, 2), I(p, 3), B, T, C));
                  return 0.0;
                }});
  cs.push_back({"embedding_shard_forward", "embedding_shard_forward",
                {{N * C, DType::F32}, {N, DType::I32, 0, V - 0.01f}, {6 * C, DType::F32}, {T * C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::EmbeddingShardForward(F(p, 0), I(p, 1), F(p, 2), F(p, 3), B, T, C, 5, 6));
                  return 0.0;
                }});
  cs.push_back({"embedding_shard_backward", "embedding_shard_backward",
                {{6 * C, DType::F32}, {T * C, DType::F32}, {N * C, DType::F32}, {N, DType::I32, 0, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::EmbeddingShardBackward(F(p, 0), F(p, 1), F(p, 2), I(p, 3), B, T, C, 5, 6));
                  return 0.0;
                }});
  // Targets in [-1, V): some rows ignored.
  cs.push_back({"softmax_xent_forward", "softmax_xent_forward",
                {{N, DType::F32}, {N * Vp, DType::F32}, {N * Vp, DType::F32, -5, 5}, {N, DType::I32, -1, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::SoftmaxXentForward(F(p, 0), F(p, 1), F(p, 2), I(p, 3), N, Vp, V));
                  return 0.0;
                }});
  cs.push_back({"softmax_xent_backward", "softmax_xent_backward",
                {{N * Vp, DType::F32}, {N * Vp, DType::F32, 0, 1}, {N, DType::I32, -1, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::SoftmaxXentBackward(F(p, 0), F(p, 1), I(p, 2), 0.25f, N, Vp, V));
                  return 0.0;
                }});
  // A shard of 6 columns starting at 6, 5 of them real (vocabulary 11).
  cs.push_back({"xent_shard_max", "xent_shard_max", {{N, DType::F32}, {N * 6, DType::F32, -5, 5}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::XentShardMax(F(p, 0), F(p, 1), N, 6, 5));
                  return 0.0;
                }});
  cs.push_back({"xent_shard_sumexp", "xent_shard_sumexp",
                {{N, DType::F32}, {N, DType::F32}, {N * 6, DType::F32, -5, 5}, {N, DType::F32, 4, 5}, {N, DType::I32, -1, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::XentShardSumexp(F(p, 0), F(p, 1), F(p, 2), F(p, 3), I(p, 4), N, 6, 5, 6));
                  return 0.0;
                }});
  cs.push_back({"xent_shard_finish", "xent_shard_finish",
                {{N, DType::F32}, {N * 6, DType::F32}, {N * 6, DType::F32, -5, 5}, {N, DType::F32, 4, 5}, {N, DType::F32, 1, 9},
                 {N, DType::F32, -2, 0}, {N, DType::I32, -1, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::XentShardFinish(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), I(p, 6), N, 6, 5));
                  return 0.0;
                }});
  cs.push_back({"xent_shard_backward", "xent_shard_backward",
                {{N * 6, DType::F32}, {N * 6, DType::F32, 0, 1}, {N, DType::I32, -1, V - 0.01f}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::XentShardBackward(F(p, 0), F(p, 1), I(p, 2), 0.5f, N, 6, 5, 6));
                  return 0.0;
                }});
  return cs;
}

std::vector<KernelCase> matmul_cases() {
  std::vector<KernelCase> cs;
  cs.push_back({"matmul_forward", "matmul_forward", {{N * OC, DType::F32}, {N * C, DType::F32}, {OC * C, DType::F32}, {OC, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::MatmulForward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), N, C, OC));
                  return 0.0;
                }});
  cs.push_back({"matmul_forward", "matmul_forward (large, no bias)",
                {{300 * 200, DType::F32}, {300 * 150, DType::F32}, {200 * 150, DType::F32}}, [](Backend& be, const auto& p) {
                  be.run(ops::k::MatmulForward(F(p, 0), F(p, 1), F(p, 2), nullptr, 300, 150, 200));
                  return 0.0;
                }});
  cs.push_back({"matmul_backward", "matmul_backward",
                {{N * C, DType::F32}, {OC * C, DType::F32}, {OC, DType::F32}, {N * OC, DType::F32}, {N * C, DType::F32}, {OC * C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::MatmulBackward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), N, C, OC));
                  return 0.0;
                }});
  // fc + GELU as one operator: out and pre; then d(pre) over d(out), dX, dW, db.
  cs.push_back({"linear_gelu_forward", "linear_gelu_forward",
                {{N * OC, DType::F32}, {N * OC, DType::F32}, {N * C, DType::F32}, {OC * C, DType::F32}, {OC, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::LinearGeluForward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), N, C, OC));
                  return 0.0;
                }});
  cs.push_back({"linear_gelu_backward", "linear_gelu_backward",
                {{N * C, DType::F32}, {OC * C, DType::F32}, {OC, DType::F32}, {N * OC, DType::F32}, {N * OC, DType::F32, -4, 4},
                 {N * C, DType::F32}, {OC * C, DType::F32}},
                [](Backend& be, const auto& p) {
                  be.run(ops::k::LinearGeluBackward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), F(p, 4), F(p, 5), F(p, 6), N, C, OC));
                  return 0.0;
                }});
  // 16-bit operands: where the CPU has them (the strict device delegates the answer).
  for (DType t : {DType::BF16, DType::F16}) {
    if (!ops::cpu_backend().has(ops::Kernel::MatmulForward, t)) continue;
    CHECK(strict().has(ops::Kernel::MatmulForward, t));
    const std::string dn = ops::dtype_name(t);
    cs.push_back({"matmul16_forward", "matmul16_forward " + dn, {{N * OC, DType::F32}, {N * C, t}, {OC * C, t}, {OC, t}},
                  [t](Backend& be, const auto& p) {
                    be.run(ops::k::MatmulForward(F(p, 0), p[1], p[2], p[3], N, C, OC), t);
                    return 0.0;
                  }});
    cs.push_back({"matmul16_backward", "matmul16_backward " + dn,
                  {{N * C, DType::F32}, {OC * C, DType::F32}, {OC, DType::F32}, {N * OC, t}, {N * C, t}, {OC * C, t}},
                  [t](Backend& be, const auto& p) {
                    be.run(ops::k::MatmulBackward(F(p, 0), F(p, 1), F(p, 2), p[3], p[4], p[5], N, C, OC), t);
                    return 0.0;
                  }});
  }
  return cs;
}

std::vector<KernelCase> attention_cases() {
  std::vector<KernelCase> cs;
  for (const bool gqa : {false, true}) {
    const ops::Heads hd = gqa ? kGqa : kMha;
    const int Cq = gqa ? CQ : 8, Wd = gqa ? W : 24, nh = hd.q;
    const std::string tag = gqa ? " (grouped-query, dropout)" : " (multi-head)";
    const ops::DropoutSpec drop = gqa ? ops::DropoutSpec{0.1f, 99, 5} : ops::DropoutSpec{};
    cs.push_back({"rope_forward", "rope_forward" + tag, {{N * Wd, DType::F32}, {N * Wd, DType::F32}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::RopeForward(F(p, 0), F(p, 1), B, T, Cq, hd, 10000.0f));
                    return 0.0;
                  }});
    cs.push_back({"rope_backward", "rope_backward" + tag, {{N * Wd, DType::F32}, {N * Wd, DType::F32}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::RopeBackward(F(p, 0), F(p, 1), B, T, Cq, hd, 10000.0f));
                    return 0.0;
                  }});
    cs.push_back({"attention_forward", "attention_forward" + tag,
                  {{N * Cq, DType::F32}, {B * nh * T, DType::F32}, {N * Wd, DType::F32, -2, 2}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::AttentionForward(F(p, 0), F(p, 1), F(p, 2), B, T, Cq, hd, drop));
                    return 0.0;
                  }});
    const int64_t work = ops::k::AttentionBackward::work_floats(B, T, Cq, hd);
    std::vector<Buf> bb = {{N * Wd, DType::F32}, {N * Cq, DType::F32}, {N * Wd, DType::F32, -2, 2}, {B * nh * T, DType::F32, 0, 1}};  // lse
    if (work) bb.push_back({work, DType::F32});
    cs.push_back({"attention_backward", "attention_backward" + tag, bb, [=](Backend& be, const auto& p) {
                    be.run(ops::k::AttentionBackward(F(p, 0), F(p, 1), F(p, 2), F(p, 3), B, T, Cq, hd, drop, work ? F(p, 4) : nullptr));
                    return 0.0;
                  }});
  }
  return cs;
}

// The KV cache in every format: rows 3 (> B) x context 8 x NKV*HS channels.
constexpr int kRows = 3, kCtx = 8, kCkv = NKV * HS;

ops::KvView kv_of(const std::vector<void*>& p, DType dt) {
  ops::KvView kv;
  kv.k = p[0];
  kv.v = p[1];
  if (dt == DType::I8) {
    kv.k_scale = F(p, 2);
    kv.v_scale = F(p, 3);
  }
  kv.dtype = dt;
  kv.context = kCtx;
  return kv;
}

std::vector<Buf> kv_bufs(DType dt) {
  const int64_t n = int64_t{kRows} * kCtx * kCkv;
  std::vector<Buf> b = {{n, dt, dt == DType::I8 ? -127.0f : -1.0f, dt == DType::I8 ? 127.99f : 1.0f},
                        {n, dt, dt == DType::I8 ? -127.0f : -1.0f, dt == DType::I8 ? 127.99f : 1.0f}};
  if (dt == DType::I8) {
    b.push_back({int64_t{kRows} * kCtx * NKV, DType::F32, 0.001f, 0.02f});
    b.push_back({int64_t{kRows} * kCtx * NKV, DType::F32, 0.001f, 0.02f});
  } else {  // unused slots: the indices below stay the same
    b.push_back({1, DType::F32});
    b.push_back({1, DType::F32});
  }
  return b;
}

std::vector<KernelCase> kv_cache_cases() {
  std::vector<KernelCase> cs;
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I8}) {
    const std::string dn = ops::dtype_name(dt);
    std::vector<Buf> wb = kv_bufs(dt);
    wb.push_back({N * W, DType::F32, -2, 2});
    cs.push_back({"kv_cache_write", "kv_cache_write " + dn, wb, [dt](Backend& be, const auto& p) {
                    be.run(ops::k::KvCacheWrite(kv_of(p, dt), F(p, 4), B, T, CQ, kGqa));
                    return 0.0;
                  }});
    std::vector<Buf> db = kv_bufs(dt);
    db.push_back({B * CQ, DType::F32});
    db.push_back({B * W, DType::F32, -2, 2});
    db.push_back({B, DType::I32, 0, kCtx - 0.01f});
    for (const float theta : {0.0f, 10000.0f})
      cs.push_back({"attention_decode", "attention_decode " + dn + (theta > 0 ? " (rope)" : ""), db, [dt, theta](Backend& be, const auto& p) {
                      be.run(ops::k::AttentionDecode(F(p, 4), F(p, 5), kv_of(p, dt), I(p, 6), B, CQ, kGqa, theta));
                      return 0.0;
                    }});
  }
  return cs;
}

// The 16-bit-native kernels, in bf16 and fp16 (16-bit activations, fp32
// parameters and statistics, except the embedding's tables, read as stored in 16 bits).
std::vector<KernelCase> native16_cases() {
  std::vector<KernelCase> cs;
  const ops::DropoutSpec drop{0.2f, 1234, 77};
  for (DType t : {DType::BF16, DType::F16}) {
    const std::string tag = std::string(" ") + ops::dtype_name(t);
    cs.push_back({"gelu_forward16", "gelu_forward16" + tag, {{kBig, t}, {kBig, t, -6, 6}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::GeluForward(p[0], p[1], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"gelu_backward16", "gelu_backward16" + tag, {{kBig, t}, {kBig, t, -6, 6}, {kBig, t}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::GeluBackward(p[0], p[1], p[2], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"relu2_forward16", "relu2_forward16" + tag, {{kBig, t}, {kBig, t, -6, 6}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::Relu2Forward(p[0], p[1], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"relu2_backward16", "relu2_backward16" + tag, {{kBig, t}, {kBig, t, -6, 6}, {kBig, t}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::Relu2Backward(p[0], p[1], p[2], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"swiglu_forward16", "swiglu_forward16" + tag, {{N * H, t}, {N * 2 * H, t, -4, 4}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::SwigluForward(p[0], p[1], N, H), t);
                    return 0.0;
                  }});
    cs.push_back({"swiglu_backward16", "swiglu_backward16" + tag, {{N * 2 * H, t}, {N * H, t}, {N * 2 * H, t, -4, 4}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::SwigluBackward(p[0], p[1], p[2], N, H), t);
                    return 0.0;
                  }});
    cs.push_back({"add_forward16", "add_forward16" + tag, {{kBig, t}, {kBig, t}, {kBig, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddForward(p[0], p[1], p[2], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"add_inplace16", "add_inplace16" + tag, {{kBig, t}, {kBig, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddInplace(p[0], p[1], kBig), t);
                    return 0.0;
                  }});
    cs.push_back({"dropout_forward16", "dropout_forward16" + tag, {{kBig, t}, {kBig, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::DropoutForward(p[0], p[1], kBig, drop), t);
                    return 0.0;
                  }});
    cs.push_back({"dropout_backward16", "dropout_backward16" + tag, {{kBig, t}, {kBig, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::DropoutBackward(p[0], p[1], kBig, drop), t);
                    return 0.0;
                  }});
    cs.push_back({"layernorm_forward16", "layernorm_forward16" + tag,
                  {{N * C, t}, {N, DType::F32}, {N, DType::F32}, {N * C, t, -3, 3}, {C, DType::F32}, {C, DType::F32}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::LayerNormForward(p[0], F(p, 1), F(p, 2), p[3], F(p, 4), F(p, 5), N, C, 1e-5f), t);
                    return 0.0;
                  }});
    cs.push_back({"layernorm_backward16", "layernorm_backward16" + tag,
                  {{N * C, t}, {C, DType::F32}, {C, DType::F32}, {N * C, t}, {N * C, t}, {C, DType::F32}, {N, DType::F32},
                   {N, DType::F32, 0.5f, 2.0f}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::LayerNormBackward(p[0], F(p, 1), F(p, 2), p[3], p[4], F(p, 5), F(p, 6), F(p, 7), N, C), t);
                    return 0.0;
                  }});
    cs.push_back({"rmsnorm_forward16", "rmsnorm_forward16" + tag, {{N * C, t}, {N, DType::F32}, {N * C, t, -3, 3}, {C, DType::F32}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::RmsNormForward(p[0], F(p, 1), p[2], F(p, 3), N, C, 1e-6f), t);
                    return 0.0;
                  }});
    cs.push_back({"rmsnorm_backward16", "rmsnorm_backward16" + tag,
                  {{N * C, t}, {C, DType::F32}, {N * C, t}, {N * C, t}, {C, DType::F32}, {N, DType::F32, 0.5f, 2.0f}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::RmsNormBackward(p[0], F(p, 1), p[2], p[3], F(p, 4), F(p, 5), N, C), t);
                    return 0.0;
                  }});
    cs.push_back({"add_layernorm_forward", "add_layernorm_forward" + tag,
                  {{N * C, t}, {N * C, t}, {N, DType::F32}, {N, DType::F32}, {N * C, t, -3, 3}, {N * C, t, -3, 3},
                   {C, DType::F32}, {C, DType::F32}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddLayerNormForward(p[0], p[1], F(p, 2), F(p, 3), p[4], p[5], F(p, 6), F(p, 7), N, C, 1e-5f), t);
                    return 0.0;
                  }});
    cs.push_back({"add_layernorm_backward", "add_layernorm_backward" + tag,
                  {{N * C, t}, {N * C, t}, {C, DType::F32}, {C, DType::F32}, {N * C, t}, {N * C, t}, {N * C, t},
                   {C, DType::F32}, {N, DType::F32}, {N, DType::F32, 0.5f, 2.0f}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddLayerNormBackward(p[0], p[1], F(p, 2), F(p, 3), p[4], p[5], p[6], F(p, 7), F(p, 8), F(p, 9),
                                              N, C), t);
                    return 0.0;
                  }});
    cs.push_back({"add_rmsnorm_forward", "add_rmsnorm_forward" + tag,
                  {{N * C, t}, {N * C, t}, {N, DType::F32}, {N * C, t, -3, 3}, {N * C, t, -3, 3}, {C, DType::F32}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddRmsNormForward(p[0], p[1], F(p, 2), p[3], p[4], F(p, 5), N, C, 1e-6f), t);
                    return 0.0;
                  }});
    cs.push_back({"add_rmsnorm_backward", "add_rmsnorm_backward" + tag,
                  {{N * C, t}, {N * C, t}, {C, DType::F32}, {N * C, t}, {N * C, t}, {N * C, t}, {C, DType::F32},
                   {N, DType::F32, 0.5f, 2.0f}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::AddRmsNormBackward(p[0], p[1], F(p, 2), p[3], p[4], p[5], F(p, 6), F(p, 7), N, C), t);
                    return 0.0;
                  }});
    cs.push_back({"embedding_forward16", "embedding_forward16" + tag,
                  {{N * C, t}, {N, DType::I32, 0, V - 0.01f}, {V * C, t}, {T * C, t}},  // tables stored in t
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::EmbeddingForward(p[0], I(p, 1), p[2], p[3], B, T, C), t);
                    return 0.0;
                  }});
    cs.push_back({"embedding_backward16", "embedding_backward16" + tag,
                  {{V * C, DType::F32}, {T * C, DType::F32}, {N * C, t}, {N, DType::I32, 0, V - 0.01f}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::EmbeddingBackward(F(p, 0), F(p, 1), p[2], I(p, 3), B, T, C), t);
                    return 0.0;
                  }});
    cs.push_back({"rope_forward16", "rope_forward16" + tag, {{N * W, t}, {N * W, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::RopeForward(p[0], p[1], B, T, CQ, kGqa, 10000.0f), t);
                    return 0.0;
                  }});
    cs.push_back({"rope_backward16", "rope_backward16" + tag, {{N * W, t}, {N * W, t}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::RopeBackward(p[0], p[1], B, T, CQ, kGqa, 10000.0f), t);
                    return 0.0;
                  }});
    // Grouped-query attention with dropout: the backward's fp32 workspace and its group fold.
    const int64_t work = ops::k::AttentionBackward::work_floats(B, T, CQ, kGqa);
    cs.push_back({"attention_forward16", "attention_forward16" + tag,
                  {{N * CQ, t}, {B * NH * T, DType::F32}, {N * W, t, -2, 2}}, [=](Backend& be, const auto& p) {
                    be.run(ops::k::AttentionForward(p[0], F(p, 1), p[2], B, T, CQ, kGqa, drop), t);
                    return 0.0;
                  }});
    cs.push_back({"attention_backward16", "attention_backward16" + tag,
                  {{N * W, t}, {N * CQ, t}, {N * W, t, -2, 2}, {B * NH * T, DType::F32, 0, 1}, {work, DType::F32}},
                  [=](Backend& be, const auto& p) {
                    be.run(ops::k::AttentionBackward(p[0], p[1], p[2], F(p, 3), B, T, CQ, kGqa, drop, F(p, 4)), t);
                    return 0.0;
                  }});
  }
  return cs;
}

std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> all;
  for (auto part : {memory_and_generic_cases, pointwise_and_norm_cases, embedding_and_loss_cases, matmul_cases,
                    attention_cases, kv_cache_cases, native16_cases})
    for (KernelCase& c : part()) all.push_back(std::move(c));
  return all;
}

// What a Backend declares: its virtual methods as ops/backend.h declares them, and the
// kernels of its table (ops/kernels.h) the CPU backend has entries for, by kernel name.
std::set<std::string> declared_methods() {
  std::ifstream f(std::string(RUNNER_TEST_DIR) + "/../ops/backend.h");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::set<std::string> out;
  const std::regex decl(R"(virtual\s+[A-Za-z_][\w:<>]*\s*[\*&]?\s*([a-z_][a-z0-9_]*)\s*\()");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1].str());
  for (int i = 0; i < ops::kKernelCount; ++i)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      if (ops::cpu_backend().has(static_cast<ops::Kernel>(i), t)) out.insert(ops::kernel_name(static_cast<ops::Kernel>(i)));
  return out;
}

// A case's method as the table names it: "layernorm_forward16" -> "LayerNormForward" (its
// 16-bit entries are the same kernel's); a memory method ("copy") stays as it is.
// Only "16" is dropped: other digits belong to the kernel's name ("relu2_forward" -> "Relu2Forward").
std::string kernel_of(const std::string& method) {
  std::string camel;
  bool up = true;
  for (size_t i = 0; i < method.size(); ++i) {
    const char ch = method[i];
    if (ch == '_') {
      up = true;
    } else if (method.compare(i, 2, "16") == 0) {
      ++i;  // matmul16_forward, gelu_forward16
    } else if (ch >= '0' && ch <= '9') {
      camel += ch;
      up = false;
    } else {
      camel += up ? static_cast<char>(ch - 'a' + 'A') : ch;
      up = false;
    }
  }
  for (auto [from, to] : {std::pair<std::string, std::string>{"Layernorm", "LayerNorm"}, {"Rmsnorm", "RmsNorm"}})
    for (size_t at; (at = camel.find(from)) != std::string::npos;) camel.replace(at, from.size(), to);
  for (int i = 0; i < ops::kKernelCount; ++i)
    if (camel == ops::kernel_name(static_cast<ops::Kernel>(i))) return camel;
  return method;
}

}  // namespace

TEST_CASE("strict device: every Backend kernel equals the CPU backend's, bit for bit, on random inputs") {
  const std::vector<KernelCase> cases = all_cases();
  uint64_t seed = 1;
  for (const KernelCase& c : cases) {
    CAPTURE(c.name);
    check_bit_identical(c, seed++);
  }
  // The table names every kernel: a Backend method added without an entry here fails. The
  // memory and queue methods are the cases above (crossings, order, poison, reuse).
  // The checkpoint staging (alloc_pinned .. stage_wait) is proven by the checkpoint tests on the
  // strict device (test_checkpoint_strict and the strict-vs-cpu run test).
  const std::set<std::string> not_kernels = {"name",         "host_memory", "mem_alloc",   "mem_free",
                                             "copy_in",      "copy_out",    "synchronize", "matmul16_available",
                                             "alloc_pinned", "free_pinned", "stage_out",   "stage_fence",
                                             "stage_wait",   "native16_available"};
  std::set<std::string> covered;
  for (const KernelCase& c : cases) covered.insert(kernel_of(c.method));
  const std::set<std::string> declared = declared_methods();
  REQUIRE(declared.size() > 30);  // the parse found them
  for (const std::string& m : declared) {
    CAPTURE(m);
    CHECK((covered.count(m) == 1 || not_kernels.count(m) == 1));
  }
  for (const std::string& m : covered) CHECK_MESSAGE(declared.count(m) == 1, m);
}
