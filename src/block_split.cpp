// src/block_split.cpp — a block over position progressions as contiguous blocks (block_split.hpp).
#include "burstlab/block_split.hpp"

#include <algorithm>

namespace burstlab {

namespace {

// ceil(x / s) for s > 0 and any sign of x.
int64_t ceil_div(int64_t x, int64_t s) { return x >= 0 ? (x + s - 1) / s : -((-x) / s); }

bool few(const std::vector<Progression>& g, int64_t n, SplitLimits limits) {
  return !g.empty() && g.size() <= limits.max_progressions && int64_t(g.size()) * limits.min_rows <= n;
}

// No query at a global position in [i_first, i_last] sees a key in [j0, j1): a band's row bounds
// never decrease with i (eq. 3.4), so the first row's lower and the last row's upper bound
// decide. With a document mask, only `false` is known.
bool band_hides(const MaskParams& m, int64_t i_first, int64_t i_last, int64_t j0, int64_t j1) {
  if (m.doc) return false;
  int64_t lo_first, hi_first, lo_last, hi_last;
  row_range(m, i_first, &lo_first, &hi_first);
  row_range(m, i_last, &lo_last, &hi_last);
  return hi_last <= j0 || lo_first >= j1;
}

// A pair of progressions of stride s > 1 as a band over local positions (the header's L, R).
BlockPart local_part(const MaskParams& m, const Progression& a, const Progression& c, int64_t s) {
  BlockPart b;
  const int64_t off = m.N_k - m.N_q, nq = a.n, nk = c.n;
  const bool has_l = m.left >= 0, has_r = m.right >= 0;
  const int64_t L = has_l ? ceil_div(a.pos + off - m.left - c.pos, s) : 0;
  const int64_t R = has_r ? ceil_div(a.pos + off + m.right + 1 - c.pos, s) : 0;
  b.hidden = (has_l && has_r && R <= L) || (has_r && nq - 1 + R <= 0) || (has_l && std::max<int64_t>(0, L) >= nk);
  b.local = true;
  b.q_pos = contiguous(0, nq);
  b.k_pos = contiguous(0, nk);
  if (b.hidden) {  // a band that no row reaches (keys up to i - nq), for a forward's identity rows
    b.mask.N_q = nq + nk;
    b.mask.N_k = nk;
    b.mask.left = -1;
    b.mask.right = 0;
    return b;
  }
  // Row i's diagonal is i + delta with delta = N_k' - N_q', chosen in [L, R - 1] so that both
  // edges are >= 0, as close to the natural nk - nq as the band allows.
  const int64_t t = nk - nq;
  int64_t delta = t;
  if (has_r) delta = std::min(delta, R - 1);
  if (has_l) delta = std::max(delta, L);
  b.mask.N_q = nq + std::max<int64_t>(0, t - delta);
  b.mask.N_k = nk + std::max<int64_t>(0, delta - t);
  b.mask.left = has_l ? delta - L : -1;
  b.mask.right = has_r ? R - 1 - delta : -1;
  return b;
}

}  // namespace

std::vector<Progression> progressions(Positions p) {
  std::vector<Progression> g;
  for (int64_t j = 0; j < p.n; ++j) {
    const int64_t x = p[j];
    if (!g.empty()) {
      Progression& l = g.back();
      const int64_t last = l.pos + l.stride * (l.n - 1);
      if (l.n == 1 && x > last) {
        l.stride = x - last;
        ++l.n;
        continue;
      }
      if (x == last + l.stride) {
        ++l.n;
        continue;
      }
    }
    g.push_back({j, x, 1, 1});
  }
  return g;
}

std::vector<BlockPart> split_block(const MaskParams& m, Positions q, Positions k, SplitLimits limits) {
  const std::vector<Progression> gq = progressions(q), gk = progressions(k);
  if (!few(gq, q.n, limits) || !few(gk, k.n, limits)) return {};
  std::vector<BlockPart> parts;
  for (const Progression& a : gq)
    for (const Progression& c : gk) {
      const int64_t sa = a.n > 1 ? a.stride : 0, sc = c.n > 1 ? c.stride : 0;
      if (sa && sc && sa != sc) return {};
      const int64_t s = std::max<int64_t>({sa, sc, 1});
      BlockPart b;
      if (s == 1) {
        b.mask = m;
        b.q_pos = contiguous(a.pos, a.n);
        b.k_pos = contiguous(c.pos, c.n);
        b.hidden = band_hides(m, a.pos, a.pos + a.n - 1, c.pos, c.pos + c.n);
      } else {
        if (m.doc || m.block) return {};
        b = local_part(m, a, c, s);
      }
      b.q_at = a.at;
      b.q_n = a.n;
      b.k_at = c.at;
      b.k_n = c.n;
      parts.push_back(b);
    }
  return parts;
}

Problem part_problem(const Problem& p, const BlockPart& part) {
  if (!part.local) return p;
  Problem r = p;
  r.N_q = part.mask.N_q;
  r.N_k = part.mask.N_k;
  r.mask = MaskSpec{};
  r.mask.window_left = part.mask.left;
  r.mask.window_right = part.mask.right;
  return r;
}

}  // namespace burstlab
