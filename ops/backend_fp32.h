// The F32 entries of a backend whose kernels are fp32 member functions with one set of
// signatures (the CPU's and CUDA's): each entry casts its args struct's pointers to fp32 and
// calls the member named after the kernel. Registered once here so the two backends cannot
// drift apart in how they read an args struct; each registers its other entries itself.
// Included only by those backends' sources.
#pragma once
#include "ops/backend.h"

namespace ops {

template <class Self>
void Backend::provide_fp32_members(Self* self) {
  // clang-format off
  provide<k::EmbeddingForward>(DType::F32, [self](const k::EmbeddingForward& q) { embedding_forward_as_shard(*self, q); });
  provide<k::EmbeddingBackward>(DType::F32, [self](const k::EmbeddingBackward& q) { embedding_backward_as_shard(*self, q); });
  provide<k::EmbeddingShardForward>(DType::F32, [self](const k::EmbeddingShardForward& q) { self->embedding_shard_forward(static_cast<float*>(q.out), q.tokens, static_cast<const float*>(q.wte), static_cast<const float*>(q.wpe), q.B, q.T, q.C, q.vstart, q.Vlocal); });
  provide<k::EmbeddingShardBackward>(DType::F32, [self](const k::EmbeddingShardBackward& q) { self->embedding_shard_backward(static_cast<float*>(q.dwte), static_cast<float*>(q.dwpe), static_cast<const float*>(q.dout), q.tokens, q.B, q.T, q.C, q.vstart, q.Vlocal); });
  provide<k::LayerNormForward>(DType::F32, [self](const k::LayerNormForward& q) { self->layernorm_forward(static_cast<float*>(q.out), static_cast<float*>(q.mean), static_cast<float*>(q.rstd), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), static_cast<const float*>(q.bias), q.N, q.C, q.eps); });
  provide<k::LayerNormBackward>(DType::F32, [self](const k::LayerNormBackward& q) { self->layernorm_backward(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), static_cast<const float*>(q.dout), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), static_cast<const float*>(q.mean), static_cast<const float*>(q.rstd), q.N, q.C); });
  provide<k::RmsNormForward>(DType::F32, [self](const k::RmsNormForward& q) { self->rmsnorm_forward(static_cast<float*>(q.out), static_cast<float*>(q.rstd), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), q.N, q.C, q.eps); });
  provide<k::RmsNormBackward>(DType::F32, [self](const k::RmsNormBackward& q) { self->rmsnorm_backward(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<const float*>(q.dout), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), static_cast<const float*>(q.rstd), q.N, q.C); });
  provide<k::MatmulForward>(DType::F32, [self](const k::MatmulForward& q) { self->matmul_forward(static_cast<float*>(q.out), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), static_cast<const float*>(q.bias), q.N, q.C, q.OC); });
  provide<k::MatmulBackward>(DType::F32, [self](const k::MatmulBackward& q) { self->matmul_backward(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), static_cast<const float*>(q.dout), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), q.N, q.C, q.OC); });
  provide<k::RopeForward>(DType::F32, [self](const k::RopeForward& q) { self->rope_forward(static_cast<float*>(q.out), static_cast<const float*>(q.inp), q.B, q.T, q.C, q.heads, q.theta); });
  provide<k::RopeBackward>(DType::F32, [self](const k::RopeBackward& q) { self->rope_backward(static_cast<float*>(q.dinp), static_cast<const float*>(q.dout), q.B, q.T, q.C, q.heads, q.theta); });
  provide<k::AttentionForward>(DType::F32, [self](const k::AttentionForward& q) { self->attention_forward(static_cast<float*>(q.out), static_cast<float*>(q.lse), static_cast<const float*>(q.qkv), q.B, q.T, q.C, q.heads, q.drop); });
  provide<k::AttentionBackward>(DType::F32, [self](const k::AttentionBackward& q) { self->attention_backward(static_cast<float*>(q.dqkv), static_cast<const float*>(q.dout), static_cast<const float*>(q.qkv), static_cast<const float*>(q.lse), q.B, q.T, q.C, q.heads, q.drop, static_cast<float*>(q.work)); });
  provide<k::LinearGeluBackward>(DType::F32, [self](const k::LinearGeluBackward& q) { self->linear_gelu_backward(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), static_cast<float*>(q.dpre), static_cast<const float*>(q.pre), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), q.N, q.C, q.OC); });
  provide<k::SwigluForward>(DType::F32, [self](const k::SwigluForward& q) { self->swiglu_forward(static_cast<float*>(q.out), static_cast<const float*>(q.inp), q.N, q.H); });
  provide<k::SwigluBackward>(DType::F32, [self](const k::SwigluBackward& q) { self->swiglu_backward(static_cast<float*>(q.dinp), static_cast<const float*>(q.dout), static_cast<const float*>(q.inp), q.N, q.H); });
  provide<k::AddForward>(DType::F32, [self](const k::AddForward& q) { self->add_forward(static_cast<float*>(q.out), static_cast<const float*>(q.a), static_cast<const float*>(q.b), q.n); });
  provide<k::AddInplace>(DType::F32, [self](const k::AddInplace& q) { self->add_inplace(static_cast<float*>(q.dst), static_cast<const float*>(q.src), q.n); });
  provide<k::DropoutForward>(DType::F32, [self](const k::DropoutForward& q) { self->dropout_forward(static_cast<float*>(q.out), static_cast<const float*>(q.inp), q.n, q.drop); });
  provide<k::DropoutBackward>(DType::F32, [self](const k::DropoutBackward& q) { self->dropout_backward(static_cast<float*>(q.dinp), static_cast<const float*>(q.dout), q.n, q.drop); });
  provide<k::SoftmaxXentForward>(DType::F32, [self](const k::SoftmaxXentForward& q) { self->softmax_xent_forward(static_cast<float*>(q.losses), static_cast<float*>(q.probs), static_cast<const float*>(q.logits), q.targets, q.N, q.V, q.Vreal); });
  provide<k::SoftmaxXentBackward>(DType::F32, [self](const k::SoftmaxXentBackward& q) { self->softmax_xent_backward(static_cast<float*>(q.dlogits), static_cast<const float*>(q.probs), q.targets, q.dloss, q.N, q.V, q.Vreal); });
  provide<k::XentShardMax>(DType::F32, [self](const k::XentShardMax& q) { self->xent_shard_max(static_cast<float*>(q.rowmax), static_cast<const float*>(q.logits), q.N, q.V, q.Vreal); });
  provide<k::XentShardSumexp>(DType::F32, [self](const k::XentShardSumexp& q) { self->xent_shard_sumexp(static_cast<float*>(q.sumexp), static_cast<float*>(q.tlogit), static_cast<const float*>(q.logits), static_cast<const float*>(q.rowmax), q.targets, q.N, q.V, q.Vreal, q.vstart); });
  provide<k::XentShardFinish>(DType::F32, [self](const k::XentShardFinish& q) { self->xent_shard_finish(static_cast<float*>(q.losses), static_cast<float*>(q.probs), static_cast<const float*>(q.logits), static_cast<const float*>(q.rowmax), static_cast<const float*>(q.sumexp), static_cast<const float*>(q.tlogit), q.targets, q.N, q.V, q.Vreal); });
  provide<k::XentShardBackward>(DType::F32, [self](const k::XentShardBackward& q) { self->xent_shard_backward(static_cast<float*>(q.dlogits), static_cast<const float*>(q.probs), q.targets, q.dloss, q.N, q.V, q.Vreal, q.vstart); });
  provide<k::AdamwUpdate>(DType::F32, [self](const k::AdamwUpdate& q) { self->adamw_update(static_cast<float*>(q.param), static_cast<const float*>(q.grad), static_cast<float*>(q.m), static_cast<float*>(q.v), q.n, q.lr, q.beta1, q.beta2, q.eps, q.weight_decay, q.t, q.grad_scale); });
  provide<k::AdamwUpdateTyped>(DType::F32, [self](const k::AdamwUpdateTyped& q) { self->adamw_update_typed(q.param, q.pt, q.grad, q.gt, static_cast<float*>(q.master), static_cast<float*>(q.m), static_cast<float*>(q.v), q.n, q.a); });
  provide<k::SumSquaresTyped>(DType::F32, [self](const k::SumSquaresTyped& q) { *q.result = self->sum_squares_typed(q.x, q.t, q.n); });
  provide<k::SumSquares>(DType::F32, [self](const k::SumSquares& q) { *q.result = self->sum_squares(static_cast<const float*>(q.x), q.n); });
  provide<k::Scale>(DType::F32, [self](const k::Scale& q) { self->scale(static_cast<float*>(q.x), q.n, q.s); });
  // clang-format on
}

}  // namespace ops
