// Bucketed data-parallel gradient synchronisation and ZeRO-1 (see grad_sync.h).
#include "parallel/grad_sync.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace parallel {

namespace {
double ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace

GradSync::GradSync(Communicator& dp, std::vector<GradTensor> params, double bucket_bytes, bool zero1)
    : dp_(dp), params_(std::move(params)), zero1_(zero1 && dp.size() > 1) {
  const size_t P = params_.size();
  const size_t D = static_cast<size_t>(dp_.size());
  bucket_of_.assign(P, -1);
  owned_.resize(P);
  // Every parameter of a rank shares one value dtype (the compute dtype) and one gradient dtype
  // (the accumulation dtype); the flat buffers take them.
  for (const GradTensor& p : params_) {
    if (p.value->dtype() != params_[0].value->dtype() || p.grad->dtype() != params_[0].grad->dtype())
      throw std::logic_error("GradSync: parameters of one rank must share their value and gradient dtypes");
  }
  if (P > 0) {
    vtype_ = params_[0].value->dtype();
    gtype_ = params_[0].grad->dtype();
  }
  const size_t cap = std::max<size_t>(1, static_cast<size_t>(bucket_bytes / static_cast<double>(ops::dtype_size(gtype_))));
  // Buckets in reverse graph order, whole parameters each, padded to a multiple of dp.
  size_t offset = 0;
  std::vector<size_t> param_offset(P, 0);
  Bucket cur;
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.len = (cur.len + D - 1) / D * D;
    offset = cur.begin + cur.len;
    buckets_.push_back(std::move(cur));
    cur = Bucket();
    cur.begin = offset;
  };
  cur.begin = 0;
  for (size_t k = P; k-- > 0;) {
    if (params_[k].excluded) continue;
    size_t n = static_cast<size_t>(params_[k].value->numel());
    param_offset[k] = cur.begin + cur.len;
    cur.len += n;
    cur.params.push_back(static_cast<int>(k));
    bucket_of_[k] = static_cast<int>(buckets_.size());
    if (cur.len >= cap) close();
  }
  close();
  flat_ = offset;
  values_ = ops::Tensor::empty({static_cast<int64_t>(std::max<size_t>(flat_, 1))}, vtype_, ops::Account::Parameters);
  grads_ = ops::Tensor::zeros({static_cast<int64_t>(std::max<size_t>(flat_, 1))}, gtype_, ops::Account::Gradients);
  values_.zero();  // padding stays zero (through the device: issue 26)
  for (size_t k = 0; k < P; ++k) {
    GradTensor& p = params_[k];
    const int64_t n = p.value->numel();
    owned_[k] = {0, n};
    if (p.excluded) continue;
    ops::Tensor v = values_.view(static_cast<int64_t>(param_offset[k]), p.value->shape());
    v.copy_from(*p.value);
    *p.value = v;
    *p.grad = grads_.view(static_cast<int64_t>(param_offset[k]), p.grad->shape());
  }
  if (zero1_) {
    size_t recv = 0;
    recv_offset_.resize(buckets_.size());
    const size_t r = static_cast<size_t>(dp_.rank());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      recv_offset_[b] = recv;
      size_t piece = buckets_[b].len / D;
      recv += piece;
      size_t a = buckets_[b].begin + r * piece, e = a + piece;  // this rank's piece
      for (int k : buckets_[b].params) {
        size_t pa = param_offset[static_cast<size_t>(k)], pe = pa + static_cast<size_t>(params_[static_cast<size_t>(k)].value->numel());
        size_t lo = std::max(pa, a), hi = std::min(pe, e);
        owned_[static_cast<size_t>(k)] = hi > lo ? std::make_pair(static_cast<int64_t>(lo - pa), static_cast<int64_t>(hi - pa))
                                                : std::make_pair<int64_t, int64_t>(0, 0);
      }
    }
    recv_ = ops::Tensor::empty({static_cast<int64_t>(std::max<size_t>(recv, 1))}, gtype_, ops::Account::Communication);
  }
  stats_.buckets = static_cast<int>(buckets_.size());
}

GradSync::~GradSync() {
  for (auto& b : buckets_)
    if (b.req) b.req->wait();
}

void GradSync::start_step() {
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.finished = false;
    b.req.reset();
  }
  stats_.hidden_ms = stats_.exposed_ms = 0;
  stats_.bytes = 0;
  active_ = true;
}

void GradSync::launch(Bucket& b) {
  const size_t gs = ops::dtype_size(gtype_);
  char* g = static_cast<char*>(grads_.raw()) + b.begin * gs;
  b.launched = Clock::now();
  stats_.bytes += static_cast<int64_t>(b.len * gs);
  if (dp_.size() == 1) {
    b.done = b.launched;
    b.finished = true;
    return;
  }
  const int64_t piece = static_cast<int64_t>(b.len) / dp_.size();
  if (zero1_)
    b.req = dp_.ireduce_scatter_sum(g, static_cast<char*>(recv_.raw()) + recv_offset_[static_cast<size_t>(&b - buckets_.data())] * gs,
                                    gtype_, piece);
  else b.req = dp_.iallreduce_sum(g, gtype_, static_cast<int64_t>(b.len));
}

void GradSync::grad_ready(int i) {
  if (!active_) return;
  int b = bucket_of_[static_cast<size_t>(i)];
  if (b < 0) return;
  Bucket& bk = buckets_[static_cast<size_t>(b)];
  if (--bk.pending == 0) launch(bk);
  progress();
}

void GradSync::progress() {
  for (auto& b : buckets_)
    if (b.req && !b.finished && b.req->test()) {
      b.finished = true;
      b.done = Clock::now();
    }
}

void GradSync::finish_grads() {
  if (!active_) return;
  auto end_backward = Clock::now();
  for (auto& b : buckets_) {
    if (b.pending > 0) throw std::logic_error("GradSync: a gradient bucket was never completed by the backward pass");
  }
  for (auto& b : buckets_)
    if (b.req && !b.finished) {
      b.req->wait();
      b.finished = true;
      b.done = Clock::now();
    }
  auto end = Clock::now();
  stats_.exposed_ms = ms(end - end_backward);
  // Hidden: the union of the buckets' in-flight intervals before the backward pass ended.
  std::vector<std::pair<Clock::time_point, Clock::time_point>> iv;
  for (auto& b : buckets_)
    if (b.req) iv.push_back({b.launched, std::min(b.done, end_backward)});
  std::sort(iv.begin(), iv.end());
  Clock::time_point reach = Clock::time_point::min();
  for (auto& [a, e] : iv) {
    Clock::time_point s = std::max(a, reach);
    if (e > s) stats_.hidden_ms += ms(e - s);
    reach = std::max(reach, e);
  }
  if (zero1_) {
    const size_t D = static_cast<size_t>(dp_.size()), r = static_cast<size_t>(dp_.rank());
    for (size_t k = 0; k < buckets_.size(); ++k) {
      size_t piece = buckets_[k].len / D;
      const size_t gs = ops::dtype_size(gtype_);
      std::memcpy(static_cast<char*>(grads_.raw()) + (buckets_[k].begin + r * piece) * gs,
                  static_cast<const char*>(recv_.raw()) + recv_offset_[k] * gs, piece * gs);
    }
  }
  for (auto& b : buckets_) b.req.reset();
  active_ = false;
}

void GradSync::gather_params() {
  if (!zero1_) return;
  auto t0 = Clock::now();
  const int64_t D = dp_.size();
  std::vector<std::unique_ptr<Request>> reqs;
  const size_t vs = ops::dtype_size(vtype_);
  for (auto& b : buckets_)
    reqs.push_back(dp_.iallgather_inplace(static_cast<char*>(values_.raw()) + b.begin * vs, vtype_, static_cast<int64_t>(b.len) / D));
  for (auto& r : reqs) r->wait();
  stats_.exposed_ms += ms(Clock::now() - t0);
}

}  // namespace parallel
