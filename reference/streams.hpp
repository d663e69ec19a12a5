// reference/streams.hpp — the harnesses' random streams (harness.cpp, lmhead_check.cpp): each
// tensor or mask part draws from its own std::mt19937_64, seeded from (seed, stream id) through
// splitmix64, so adding a tensor never shifts the values of another. Internal to the layer.
#pragma once

#include <cstdint>
#include <random>

namespace burstlab::reference {

// splitmix64: decorrelates (seed, stream) pairs before they seed mt19937_64.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::mt19937_64 stream(uint64_t seed, uint64_t id) {
  return std::mt19937_64(splitmix64(splitmix64(seed) ^ (0xD1B54A32D192ED03ull * (id + 1))));
}

}  // namespace burstlab::reference
