// plugins/cudnn/band.hpp — which part of a block cuDNN's fused attention runs, and its band in
// cuDNN's terms (host only; the plug-in cudnn_plugin.cpp, the test tests/plugin/test_cudnn_band.cpp).
// cuDNN's band: a diagonal j = i (TOP_LEFT) or j = i + k_n - q_n (BOTTOM_RIGHT); key j visible
// from row i iff j <= diagonal + right_bound and j > diagonal - left_bound (each when set).
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "burstlab/mask.hpp"

namespace burstlab::cudnn_plugin {

// The visible part of a block and its band: rows [q_at, q_at + q_n) and keys [k_at, k_at + k_n)
// of the block hold every visible pair; the other rows see no key.
struct Band {
  bool none = true;          // every pair of the (cut) block visible: no mask node
  bool hidden = false;       // no pair visible
  bool bottom_right = false; // cuDNN's diagonal alignment
  int64_t left_bound = -1;   // -1: unbounded
  int64_t right_bound = -1;
  int64_t q_at = 0, q_n = 0, k_at = 0, k_n = 0;
  std::string declined;      // non-empty: cuDNN cannot run this block, and why
};

// The block of rows [q0, q0 + nq) and keys [k0, k0 + nk) under the band m (no documents or
// block-sparse parts): row i sees keys j with i + off - left <= j <= i + off + right (eq. 3.4),
// off = q0 - k0 + N_k - N_q. Rows that see no key (above the band, or below it past the last
// key) and keys no row sees are cut off, so that in the rest the band's edges are cuDNN's:
// right_bound = off' + right >= 0 and left_bound = left - off' + 1 >= 1 about a top-left
// diagonal, or about the bottom-right one when off' = k_n - q_n and q_n <= k_n.
inline Band band_of(const MaskParams& m, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  Band band;
  band.q_n = nq, band.k_n = nk;
  const int64_t visible = count_visible(m, q0, q0 + nq, k0, k0 + nk);
  if (visible == nq * nk) return band;
  band.none = false;
  if (visible == 0) {
    band.hidden = true;
    return band;
  }
  const int64_t off = q0 - k0 + (m.N_k - m.N_q);
  const bool has_l = m.left >= 0, has_r = m.right >= 0;
  // Row i sees [lo(i), hi(i)); both are non-decreasing in i.
  const auto lo = [&](int64_t i) { return has_l ? std::max<int64_t>(0, i + off - m.left) : int64_t(0); };
  const auto hi = [&](int64_t i) { return has_r ? std::min<int64_t>(nk, i + off + m.right + 1) : nk; };
  const int64_t r0 = has_r ? std::max<int64_t>(0, -(off + m.right)) : 0;    // first row with hi > 0
  const int64_t r1 = has_l ? std::min<int64_t>(nq, nk - off + m.left) : nq;  // rows from r1 on: lo = nk
  band.q_at = r0, band.q_n = r1 - r0;
  band.k_at = lo(r0), band.k_n = hi(r1 - 1) - band.k_at;
  // cuDNN runs a left-bounded band only with n_q <= n_k: take in keys on the right that no row
  // sees (which moves no edge) until the cut block is as wide as it is tall.
  if (has_l && band.q_n > band.k_n) band.k_n = std::min(nk - band.k_at, band.q_n);
  if (has_l && band.q_n > band.k_n) {
    std::ostringstream s;
    s << "a window whose " << band.q_n << " rows that see keys span only " << band.k_n << " keys of this " << nq
      << " x " << nk << " block: cuDNN runs a left-bounded band only with n_q <= n_k";
    band.declined = s.str();
    return band;
  }
  const int64_t o = off + band.q_at - band.k_at;  // off of the cut block
  if (count_visible(m, q0 + band.q_at, q0 + r1, k0 + band.k_at, k0 + band.k_at + band.k_n) == band.q_n * band.k_n) {
    band.none = true;
    return band;
  }
  band.bottom_right = o != 0 && o == band.k_n - band.q_n && band.q_n <= band.k_n;
  const int64_t diagonal = band.bottom_right ? o : 0;
  if (has_r) band.right_bound = o + m.right - diagonal;
  if (has_l) band.left_bound = m.left - (o - diagonal) + 1;
  if ((has_r && band.right_bound < 0) || (has_l && band.left_bound < 1)) {
    std::ostringstream s;
    s << "internal: the band of a " << nq << " x " << nk << " block at offset " << off << " cut to rows " << band.q_at
      << "+" << band.q_n << ", keys " << band.k_at << "+" << band.k_n << " has bounds " << band.left_bound << ", "
      << band.right_bound;
    throw std::logic_error(s.str());
  }
  return band;
}

}  // namespace burstlab::cudnn_plugin
