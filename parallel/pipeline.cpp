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

std::vector<PipeAction> pipeline_schedule(const std::string& name, int stage, int stages, int micros) {
  if (name == "1f1b") return schedule_1f1b(stage, stages, micros);
  if (name == "gpipe") return schedule_gpipe(stage, stages, micros);
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'");
}

int max_in_flight(const std::vector<PipeAction>& schedule) {
  int cur = 0, best = 0;
  for (auto& a : schedule) {
    cur += a.forward ? 1 : -1;
    best = std::max(best, cur);
  }
  return best;
}

}  // namespace parallel

// ---- PipelineRunner ----------------------------------------------------------------------

namespace parallel {

namespace {
constexpr int kTagAct = 1, kTagGrad = 2, kTagEval = 3;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
}  // namespace

PipelineRunner::PipelineRunner(const ops::Graph& g, std::vector<ops::Executor*> slots, Communicator& world, int prev_rank,
                               int next_rank)
    : g_(g), slots_(std::move(slots)), world_(world), prev_(prev_rank), next_(next_rank) {
  auto buffer = [&](int id) {
    return ops::Tensor::zeros(g_.tensors[static_cast<size_t>(id)].shape, ops::DType::F32, ops::Account::Communication);
  };
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (prev_ >= 0) {
      act_in_.push_back(buffer(g_.stage_input));
      grad_in_.push_back(buffer(g_.stage_input));
    }
    if (next_ >= 0) act_out_.push_back(buffer(g_.stage_output));
  }
  if (next_ >= 0) grad_out_ = buffer(g_.stage_output);
  act_sends_.resize(slots_.size());
  grad_sends_.resize(slots_.size());
}

PipelineRunner::~PipelineRunner() {
  for (auto& r : act_sends_)
    if (r) r->wait();
  for (auto& r : grad_sends_)
    if (r) r->wait();
}

void PipelineRunner::wait_send(std::unique_ptr<Request>& req, double& wait_ms) {
  if (!req) return;
  auto t = Clock::now();
  req->wait();
  req.reset();
  wait_ms += ms_since(t);
}

PipelineStats PipelineRunner::train(const std::vector<PipeAction>& schedule, const std::vector<MicroBatch>& mbs, float dloss,
                                    uint64_t key, const std::function<void(int)>& final_hook) {
  PipelineStats st;
  const size_t n = slots_.size();
  const int last_micro = static_cast<int>(mbs.size()) - 1;
  for (const PipeAction& a : schedule) {
    const size_t slot = static_cast<size_t>(a.micro) % n;
    ops::Executor& ex = *slots_[slot];
    const MicroBatch& mb = mbs[static_cast<size_t>(a.micro)];
    if (a.forward) {
      float* in = nullptr;
      float* out = nullptr;
      if (prev_ >= 0) {
        auto t = Clock::now();
        world_.recv(act_in_[slot].raw(), act_in_[slot].nbytes(), prev_, kTagAct);
        st.wait_ms += ms_since(t);
        in = act_in_[slot].data<float>();
      }
      if (next_ >= 0) {
        wait_send(act_sends_[slot], st.wait_ms);
        out = act_out_[slot].data<float>();
      }
      auto t0 = Clock::now();
      auto ls = ex.forward(mb.tokens, mb.targets, true, key, mb.sample_offset, in, out);
      st.forward_ms += ms_since(t0);
      st.loss_sum += ls.sum;
      if (next_ >= 0) act_sends_[slot] = world_.isend(act_out_[slot].raw(), act_out_[slot].nbytes(), next_, kTagAct);
    } else {
      const float* dout = nullptr;
      float* din = nullptr;
      if (next_ >= 0) {
        auto t = Clock::now();
        world_.recv(grad_out_.raw(), grad_out_.nbytes(), next_, kTagGrad);
        st.wait_ms += ms_since(t);
        dout = grad_out_.data<float>();
      }
      if (prev_ >= 0) {
        wait_send(grad_sends_[slot], st.wait_ms);
        din = grad_in_[slot].data<float>();
      }
      const bool final_pass = a.micro == last_micro && final_hook;
      if (final_pass) ex.set_grad_hook(final_hook);
      auto t0 = Clock::now();
      ex.backward(dloss, dout, din);
      st.backward_ms += ms_since(t0);
      if (final_pass) ex.set_grad_hook(nullptr);
      if (prev_ >= 0) grad_sends_[slot] = world_.isend(grad_in_[slot].raw(), grad_in_[slot].nbytes(), prev_, kTagGrad);
    }
  }
  for (auto& r : act_sends_) wait_send(r, st.wait_ms);
  for (auto& r : grad_sends_) wait_send(r, st.wait_ms);
  return st;
}

ops::Executor::LossSum PipelineRunner::forward(const MicroBatch& mb) {
  ops::Executor& ex = *slots_[0];
  if (prev_ >= 0) world_.recv(act_in_[0].raw(), act_in_[0].nbytes(), prev_, kTagEval);
  auto ls = ex.forward(mb.tokens, mb.targets, false, 0, mb.sample_offset, prev_ >= 0 ? act_in_[0].data<float>() : nullptr,
                       next_ >= 0 ? act_out_[0].data<float>() : nullptr);
  if (next_ >= 0) world_.send(act_out_[0].raw(), act_out_[0].nbytes(), next_, kTagEval);
  return ls;
}

const ops::Tensor* PipelineRunner::forward_logits(const int32_t* tokens) {
  ops::Executor& ex = *slots_[0];
  if (prev_ >= 0) world_.recv(act_in_[0].raw(), act_in_[0].nbytes(), prev_, kTagEval);
  const float* in = prev_ >= 0 ? act_in_[0].data<float>() : nullptr;
  if (next_ >= 0) {
    ex.forward(tokens, nullptr, false, 0, 0, in, act_out_[0].data<float>());
    world_.send(act_out_[0].raw(), act_out_[0].nbytes(), next_, kTagEval);
    return nullptr;
  }
  return &ex.forward_logits(tokens, in);
}

}  // namespace parallel
