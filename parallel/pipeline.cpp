// Pipeline schedules (see pipeline.h).
#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace parallel {

std::vector<PipeAction> schedule_1f1b(int stage, int stages, int micros) {
  std::vector<PipeAction> s;
  int warmup = std::min(stages - stage - 1, micros);
  int f = 0, b = 0;
  for (; f < warmup; ++f) s.push_back({true, f});
  while (f < micros) {
    s.push_back({true, f++});
    s.push_back({false, b++});
  }
  while (b < micros) s.push_back({false, b++});
  return s;
}

std::vector<PipeAction> schedule_gpipe(int stage, int stages, int micros) {
  (void)stage;
  (void)stages;
  std::vector<PipeAction> s;
  for (int f = 0; f < micros; ++f) s.push_back({true, f});
  for (int b = 0; b < micros; ++b) s.push_back({false, b});
  return s;
}

std::vector<PipeAction> schedule_interleaved(int stage, int stages, int micros, int chunks) {
  if (chunks <= 1) return schedule_1f1b(stage, stages, micros);
  if (micros % stages != 0)
    throw std::invalid_argument("interleaved schedule: micro-batches must be a multiple of the pipeline stages");
  const int p = stages, v = chunks, total = micros * v;
  // The k-th forward (backward) of this stage: chunk (k / p) % v (reversed for backward), micro-batch
  // (k / (p v)) p + k % p.
  auto action = [&](int k, bool fwd) {
    int c = (k / p) % v;
    return PipeAction{fwd, (k / (p * v)) * p + k % p, fwd ? c : v - 1 - c};
  };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  std::vector<PipeAction> s;
  int f = 0, b = 0;
  for (; f < warmup; ++f) s.push_back(action(f, true));
  while (f < total) {
    s.push_back(action(f++, true));
    s.push_back(action(b++, false));
  }
  while (b < total) s.push_back(action(b++, false));
  return s;
}

std::vector<PipeAction> pipeline_schedule(const std::string& name, int stage, int stages, int micros, int chunks) {
  if (name == "1f1b") return schedule_1f1b(stage, stages, micros);
  if (name == "gpipe") return schedule_gpipe(stage, stages, micros);
  if (name == "interleaved") return schedule_interleaved(stage, stages, micros, chunks);
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'");
}

int max_in_flight(const std::vector<PipeAction>& schedule, int chunk) {
  int cur = 0, best = 0;
  for (auto& a : schedule) {
    if (a.chunk != chunk) continue;
    cur += a.forward ? 1 : -1;
    best = std::max(best, cur);
  }
  return best;
}

}  // namespace parallel

// ---- PipelineRunner ----------------------------------------------------------------------

namespace parallel {

namespace {
// Message tags carry the receiving chunk's virtual stage, so the chunks a pair of ranks
// exchange under the interleaved schedule never match each other's messages.
int tag(int vstage, int kind) { return 16 * vstage + kind; }
constexpr int kAct = 1, kGrad = 2, kEval = 3;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

// The activation and gradient buffers are tensors of the run's device; they travel through
// the world communicator's tensors() face (staged through host memory, or NCCL on a GPU).
PipelineRunner::PipelineRunner(std::vector<PipelineChunk> chunks, Communicator& world) : world_(world) {
  for (auto& pc : chunks) {
    Chunk ch;
    ch.c = std::move(pc);
    const ops::Graph& g = *ch.c.graph;
    auto buffer = [&](int id) {
      const ops::TensorDesc& d = g.tensors[static_cast<size_t>(id)];  // in its own dtype (16-bit under bf16/fp16)
      return ops::Tensor::zeros(d.shape, d.dtype, ops::Account::Communication);
    };
    for (size_t k = 0; k < ch.c.slots.size(); ++k) {
      if (ch.c.prev_rank >= 0) ch.grad_in.push_back(buffer(g.stage_input));
      if (ch.c.next_rank >= 0) ch.act_out.push_back(buffer(g.stage_output));
    }
    if (ch.c.prev_rank >= 0) ch.act_in = buffer(g.stage_input);
    if (ch.c.next_rank >= 0) ch.grad_out = buffer(g.stage_output);
    ch.act_sends.resize(ch.c.slots.size());
    ch.grad_sends.resize(ch.c.slots.size());
    chunks_.push_back(std::move(ch));
  }
}

PipelineRunner::~PipelineRunner() {
  for (auto& ch : chunks_) {
    for (auto& r : ch.act_sends)
      if (r) r->wait();
    for (auto& r : ch.grad_sends)
      if (r) r->wait();
  }
}

void PipelineRunner::wait_send(std::unique_ptr<Request>& req, double& wait_ms, int micro) {
  if (!req) return;
  if (trace_ && req->test()) {  // already sent: no wait to show
    req.reset();
    return;
  }
  auto t = Clock::now();
  const int64_t t0 = trace_ ? ops::trace_now_ns() : 0;
  req->wait();
  req.reset();
  wait_ms += ms_since(t);
  if (trace_) idle("idle: send buffer in use", -1, micro, t0);
}

void PipelineRunner::pass(const char* what, const PipeAction& a, int64_t t0_ns) {
  ops::TraceSpan s;
  s.name = std::string(what) + " mb " + std::to_string(a.micro);
  if (chunks_.size() > 1) s.name += " chunk " + std::to_string(a.chunk);
  s.cat = "pass";
  s.micro = a.micro;
  s.t0_ns = t0_ns;
  s.t1_ns = ops::trace_now_ns();
  trace_->span(s);
}

void PipelineRunner::idle(const char* what, int peer, int micro, int64_t t0_ns) {
  ops::TraceSpan s;
  s.name = what;
  s.cat = "pipeline";
  s.group = "world";
  s.peer = peer;
  s.micro = micro;
  s.t0_ns = t0_ns;
  s.t1_ns = ops::trace_now_ns();
  trace_->span(s);
}

PipelineStats PipelineRunner::train(const std::vector<PipeAction>& schedule, const std::vector<MicroBatch>& mbs, float dloss,
                                    uint64_t key, const std::function<void(int, int)>& final_hook) {
  PipelineStats st;
  const int last_micro = static_cast<int>(mbs.size()) - 1;
  for (const PipeAction& a : schedule) {
    Chunk& ch = chunks_[static_cast<size_t>(a.chunk)];
    const int prev = ch.c.prev_rank, next = ch.c.next_rank, vs = ch.c.vstage;
    const size_t slot = static_cast<size_t>(a.micro) % ch.c.slots.size();
    ops::Executor& ex = *ch.c.slots[slot];
    const MicroBatch& mb = mbs[static_cast<size_t>(a.micro)];
    if (a.forward) {
      void* in = nullptr;
      void* out = nullptr;
      if (prev >= 0) {
        auto t = Clock::now();
        const int64_t w0 = trace_ ? ops::trace_now_ns() : 0;
        world_.tensors().recv(ch.act_in.raw(), ch.act_in.nbytes(), prev, tag(vs, kAct));
        st.wait_ms += ms_since(t);
        if (trace_) idle("idle: waiting for activation", prev, a.micro, w0);
        in = ch.act_in.raw();
      }
      if (next >= 0) {
        wait_send(ch.act_sends[slot], st.wait_ms, a.micro);
        out = ch.act_out[slot].raw();
      }
      const int64_t p0 = trace_ ? ops::trace_now_ns() : 0;
      auto t0 = Clock::now();
      const double c0 = comm_clock_ ? *comm_clock_ : 0.0;
      auto ls = ex.forward(mb.tokens, mb.targets, true, key, mb.sample_offset, in, out);
      const double dc = comm_clock_ ? *comm_clock_ - c0 : 0.0;
      st.forward_ms += ms_since(t0) - dc;
      st.comm_ms += dc;
      st.loss_sum += ls.sum;
      if (trace_) pass("forward", a, p0);
      if (next >= 0)
        ch.act_sends[slot] = world_.tensors().isend(ch.act_out[slot].raw(), ch.act_out[slot].nbytes(), next, tag(vs + 1, kAct));
    } else {
      const void* dout = nullptr;
      void* din = nullptr;
      if (next >= 0) {
        auto t = Clock::now();
        const int64_t w0 = trace_ ? ops::trace_now_ns() : 0;
        world_.tensors().recv(ch.grad_out.raw(), ch.grad_out.nbytes(), next, tag(vs, kGrad));
        st.wait_ms += ms_since(t);
        if (trace_) idle("idle: waiting for gradient", next, a.micro, w0);
        dout = ch.grad_out.raw();
      }
      if (prev >= 0) {
        wait_send(ch.grad_sends[slot], st.wait_ms, a.micro);
        din = ch.grad_in[slot].raw();
      }
      const bool final_pass = a.micro == last_micro && final_hook;
      const int chunk = a.chunk;
      if (final_pass) ex.set_grad_hook([&final_hook, chunk](int node) { final_hook(chunk, node); });
      const int64_t p0 = trace_ ? ops::trace_now_ns() : 0;
      auto t0 = Clock::now();
      const double c0 = comm_clock_ ? *comm_clock_ : 0.0;
      ex.backward(dloss, dout, din);
      const double dc = comm_clock_ ? *comm_clock_ - c0 : 0.0;
      st.backward_ms += ms_since(t0) - dc;
      st.comm_ms += dc;
      if (final_pass) ex.set_grad_hook(nullptr);
      if (trace_) pass("backward", a, p0);
      if (prev >= 0)
        ch.grad_sends[slot] = world_.tensors().isend(ch.grad_in[slot].raw(), ch.grad_in[slot].nbytes(), prev, tag(vs - 1, kGrad));
    }
  }
  for (auto& ch : chunks_) {
    for (auto& r : ch.act_sends) wait_send(r, st.wait_ms, -1);
    for (auto& r : ch.grad_sends) wait_send(r, st.wait_ms, -1);
  }
  return st;
}

// One inference pass through this stage's chunks in pipeline order (a single chain across the
// ranks, so blocking sends cannot deadlock).
const ops::Tensor* PipelineRunner::eval_pass(const MicroBatch& mb, bool logits, ops::Executor::LossSum* ls) {
  const ops::Tensor* out = nullptr;
  for (Chunk& ch : chunks_) {
    ops::Executor& ex = *ch.c.slots[0];
    const int prev = ch.c.prev_rank, next = ch.c.next_rank, vs = ch.c.vstage;
    if (prev >= 0) world_.tensors().recv(ch.act_in.raw(), ch.act_in.nbytes(), prev, tag(vs, kEval));
    const void* in = prev >= 0 ? ch.act_in.raw() : nullptr;
    if (next >= 0) {
      ex.forward(mb.tokens, mb.targets, false, 0, mb.sample_offset, in, ch.act_out[0].raw());
      world_.tensors().send(ch.act_out[0].raw(), ch.act_out[0].nbytes(), next, tag(vs + 1, kEval));
    } else if (logits) {
      out = &ex.forward_logits(mb.tokens, in);
    } else {
      *ls = ex.forward(mb.tokens, mb.targets, false, 0, mb.sample_offset, in, nullptr);
    }
  }
  return out;
}

ops::Executor::LossSum PipelineRunner::forward(const MicroBatch& mb) {
  ops::Executor::LossSum ls;
  eval_pass(mb, false, &ls);
  return ls;
}

const ops::Tensor* PipelineRunner::forward_logits(const int32_t* tokens) { return eval_pass({tokens, nullptr, 0}, true, nullptr); }

}  // namespace parallel
