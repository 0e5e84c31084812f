// The inference KV cache's storage (see kv_cache.h).
#include "ops/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ops {

KvCache::KvCache(int first_layer, int layers, int64_t rows, int64_t context, int64_t C, int64_t NH, DType dtype)
    : first_(first_layer), rows_(rows), context_(context), C_(C), NH_(NH), dtype_(dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16 && dtype != DType::I8)
    throw std::invalid_argument(std::string("KV cache: no ") + dtype_name(dtype) + " format (fp32, bf16, fp16, int8)");
  if (layers < 0 || rows < 1 || context < 1 || NH < 1 || C % NH != 0)
    throw std::invalid_argument("KV cache: bad shape");
  for (int l = 0; l < layers; ++l) {
    // Uninitialised: a position is always written before any attention reads it.
    k_.push_back(Tensor::empty({rows, context, C}, dtype, Account::KvCache));
    v_.push_back(Tensor::empty({rows, context, C}, dtype, Account::KvCache));
    if (dtype == DType::I8) {
      ks_.push_back(Tensor::empty({rows, context, NH}, DType::F32, Account::KvCache));
      vs_.push_back(Tensor::empty({rows, context, NH}, DType::F32, Account::KvCache));
    }
  }
  pos_dev_ = Tensor::zeros({rows}, DType::I32, Account::Workspace);
  pos.assign(static_cast<size_t>(rows), 0);
}

void KvCache::set_positions(const std::vector<int32_t>& positions) {
  if (static_cast<int64_t>(positions.size()) > rows_)
    throw std::logic_error("KV cache: " + std::to_string(positions.size()) + " positions for " + std::to_string(rows_) + " rows");
  std::copy(positions.begin(), positions.end(), pos.begin());  // rows past them keep theirs
  pos_dev_.write_from_host(pos.data());
}

size_t KvCache::bytes_for(int layers, int64_t rows, int64_t context, int64_t C, int64_t NH, DType dtype) {
  const size_t per_position = static_cast<size_t>(C) * dtype_size(dtype) + (dtype == DType::I8 ? static_cast<size_t>(NH) * 4 : 0);
  return 2 * static_cast<size_t>(layers) * static_cast<size_t>(rows) * static_cast<size_t>(context) * per_position;
}

size_t KvCache::bytes() const {
  size_t n = 0;
  for (auto* v : {&k_, &v_, &ks_, &vs_})
    for (const Tensor& t : *v) n += t.nbytes();
  return n;
}

KvView KvCache::layer(int layer) {
  if (!has_layer(layer)) throw std::logic_error("KV cache: no layer " + std::to_string(layer));
  const size_t i = static_cast<size_t>(layer - first_);
  KvView kv;
  kv.k = k_[i].raw();
  kv.v = v_[i].raw();
  if (dtype_ == DType::I8) {
    kv.k_scale = ks_[i].data<float>();
    kv.v_scale = vs_[i].data<float>();
  }
  kv.dtype = dtype_;
  kv.context = context_;
  return kv;
}

}  // namespace ops
