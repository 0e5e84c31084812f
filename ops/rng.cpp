// Counter-based normal samples (see rng.h).
#include "ops/rng.h"

#include <cmath>

namespace ops {

float rng_normal(uint64_t key, uint64_t counter) {
  // u1 in (0, 1] so that log() is finite.
  double u1 = (static_cast<double>(mix64(key ^ mix64(2 * counter)) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = static_cast<double>(mix64(key ^ mix64(2 * counter + 1)) >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace ops
