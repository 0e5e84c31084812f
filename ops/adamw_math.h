// AdamW's arithmetic for one element, written once for every backend: the CPU's scalar loop
// (ops/cpu/adamw.cpp) and the CUDA kernels (ops/cuda/cuda_backend.cu) both call it, so that
// the two compute the same expression in the same order (the CPU's AVX-512 body is the same
// formula in intrinsics, and the tests hold it to these bits).
#pragma once
#include <math.h>

#ifdef __CUDACC__
#define OPS_HOST_DEVICE __host__ __device__
#else
#define OPS_HOST_DEVICE
#endif

namespace ops {

// AdamW (ops/kernels.h, k::AdamwUpdate) on one weight w with gradient g (already multiplied by
// the gradient scale): the moments m and v are updated in place and the new weight returned.
// a1 = 1 - beta1, a2 = 1 - beta2; inv_bc1, inv_bc2 the bias corrections 1 / (1 - beta^t).
OPS_HOST_DEVICE inline float adamw_element(float w, float g, float& m, float& v, float lr, float beta1, float beta2,
                                           float a1, float a2, float eps, float weight_decay, float inv_bc1,
                                           float inv_bc2) {
  const float mi = beta1 * m + a1 * g;
  const float vi = beta2 * v + a2 * g * g;
  m = mi;
  v = vi;
  const float mhat = mi * inv_bc1, vhat = vi * inv_bc2;
  return w - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * w);
}

}  // namespace ops

#undef OPS_HOST_DEVICE
