// Counter-based random numbers (Philox-free, splitmix64-style hashing).
//
// A random value is a pure function of (key, counter): no hidden state advances, so
// a dropout mask can be regenerated in backward instead of stored, replayed after a
// resume, and drawn identically by every parallel layout (the counter is the logical
// element index, never the rank). Keys are derived from (seed, step, layer, site).
#pragma once
#include <cstdint>

namespace ops {

inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A stable 64-bit hash of a name (FNV-1a), for keys derived from tensor names.
inline uint64_t hash_name(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return h;
}

// A key for one use site: combine any number of integers.
inline uint64_t rng_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(mix64(seed) ^ a) ^ b) ^ c);
}

inline uint32_t rng_u32(uint64_t key, uint64_t counter) {
  return static_cast<uint32_t>(mix64(key ^ mix64(counter)) >> 32);
}

// Uniform in [0, 1) with 24 bits of resolution.
inline float rng_uniform(uint64_t key, uint64_t counter) {
  return static_cast<float>(rng_u32(key, counter) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal via Box-Muller on two counters (2*counter, 2*counter+1).
float rng_normal(uint64_t key, uint64_t counter);

// A small sequential generator for host-side decisions (shuffles, sampling) whose
// whole state is two integers, so it can be checkpointed.
struct SplitMix {
  uint64_t key = 0, counter = 0;
  uint64_t next_u64() { return mix64(key ^ mix64(counter++)); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
};

}  // namespace ops
