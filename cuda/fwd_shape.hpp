// cuda/fwd_shape.hpp — which CTA shape v4's persistent forward (fwd_ws.cuh) takes for a call, by
// how many keys its query rows see on average (eq. 3.4), estimated from evenly spaced rows. Host
// only, so that tests/cuda/test_cuda_variants.cpp checks the choice on the CPU. The limits are
// where each shape measured faster on H200 (docs/performance-gpu.md).
#pragma once

#include <cstdint>

namespace burstlab::cuda::fwd_shape {

enum class Shape {
  Default,   // 2 (d = 128) or 3 (d = 64) consumer warpgroups, 128-key tiles
  FewKeys,   // one consumer warpgroup, 64-key tiles, 2 (d = 128) or 3 (d = 64) CTAs per SM
  ManyKeys,  // d = 128: 176-key tiles, one Q buffer
};

constexpr int kSamples = 64;

// The mean of keys_of_row(r) over kSamples evenly spaced rows r in [0, nq) (nq >= 1). It rounds:
// a causal N = 2K gives 1024.02 (the true mean is 1024.5), N = 1K 512.03.
template <class KeysOfRow>
double keys_per_row(int64_t nq, KeysOfRow keys_of_row) {
  int64_t sum = 0;
  for (int k = 0; k < kSamples; ++k) sum += keys_of_row((nq - 1) * k / (kSamples - 1));
  return double(sum) / kSamples;
}

// keys < 0: the host cannot see the rows (document masks, indexed positions): the default. Few
// keys make an item's loads and epilogue weigh. d = 64's limit: the few-keys shape against the
// default, per round, was 1.062-1.066x at causal N = 2K (1024 keys) and 0.962x at causal N = 3K
// (1536); the line between the medians of those ratios crosses 1 at 1344. Many keys at d = 128
// pay off above 4096.
inline Shape choose(int64_t d, double keys) {
  if (keys < 0) return Shape::Default;
  if (keys <= (d == 64 ? 1344 : 512)) return Shape::FewKeys;
  if (d == 128 && keys > 4096) return Shape::ManyKeys;
  return Shape::Default;
}

}  // namespace burstlab::cuda::fwd_shape
