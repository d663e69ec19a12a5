// burstlab/problem.hpp — the Problem every layer solves (spec §1) and its validation (§1.4).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "burstlab/error.hpp"
#include "burstlab/mask.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab {

struct Problem {
  int64_t B = 1;     // batch
  int64_t H_q = 1;   // query heads
  int64_t H_kv = 1;  // key/value heads; q-head h reads kv-head h / (H_q / H_kv)   (§1.3)
  int64_t N_q = 1;   // queries per (b, h)
  int64_t N_k = 1;   // keys per (b, h)
  int64_t d = 1;     // head dimension
  std::optional<double> scale;  // default 1 / sqrt(d)   (eq. 2.1)
  MaskSpec mask;
};

// Throws Error naming the first bad field and its value, e.g. "H_q (6) must be a multiple of
// H_kv (4)". Every host entry point calls it (or validate_views) before touching data.
void validate(const Problem& p);

// validate(p), then checks each view's dimensions against p ("Q.dim[2] (5) must equal N_q (6)")
// and that no view is null. Pass nullptr-data views only for tensors an entry point does not use.
template <class T>
void validate_views(const Problem& p, const View4<T>& Q, const View4<T>& K, const View4<T>& V);
// Checks one view: non-null data and dim == expected (rank 3 or 4). Names the view and axis.
void validate_view(const char* name, const int64_t* dim, const void* data, int rank,
                   const int64_t* expected);
// Expected logical dims (§1.2): query side (B, H_q, N_q, d), key side (B, H_kv, N_k, d),
// row statistics LSE/D (B, H_q, N_q).
void expect_q_side(const Problem& p, int64_t out[4]);
void expect_kv_side(const Problem& p, int64_t out[4]);
void expect_rows(const Problem& p, int64_t out[3]);
template <class T> void validate_q_side(const Problem& p, const char* name, const View4<T>& v);
template <class T> void validate_kv_side(const Problem& p, const char* name, const View4<T>& v);
template <class T> void validate_rows(const Problem& p, const char* name, const View3<T>& v);

// Every view of a whole-problem forward: validate_views(Q, K, V), then O (query side) and LSE.
template <class T, class L>
void validate_forward_views(const Problem& p, const View4<const T>& Q, const View4<const T>& K,
                            const View4<const T>& V, const View4<T>& O, const View3<L>& LSE);
// Every view of a whole-problem backward (eq. 5.1-5.7): validate_views(Q, K, V), then O, dO, dQ
// on the query side, dK, dV on the key side, LSE as row statistics.
template <class T, class L, class G>
void validate_backward_views(const Problem& p, const View4<const T>& Q, const View4<const T>& K,
                             const View4<const T>& V, const View4<const T>& O, const View4<const T>& dO,
                             const View3<L>& LSE, const View4<G>& dQ, const View4<G>& dK, const View4<G>& dV);

// Block entry points (§6.1-6.2): views of nq query rows (B, H_q, nq, d), nk keys (B, H_kv, nk, d)
// and nq row statistics (B, H_q, nq). Same checks as validate_view, except that a view of 0 rows
// may have null data (nothing is touched).
void validate_block_view(const char* name, const int64_t* dim, const void* data, int rank,
                         const int64_t* expected);
template <class T, class L>
void validate_block_forward_views(const Problem& p, int64_t nq, int64_t nk, const View4<const T>& Q,
                                  const View4<const T>& K, const View4<const T>& V, const View4<T>& O,
                                  const View3<L>& LSE);
template <class T, class L, class G>
void validate_block_backward_views(const Problem& p, int64_t nq, int64_t nk, const View4<const T>& Q,
                                   const View4<const T>& K, const View4<const T>& V,
                                   const View4<const T>& dO, const View3<const L>& LSE,
                                   const View3<const L>& D, const View4<G>& dQ, const View4<G>& dK,
                                   const View4<G>& dV);

double scale_of(const Problem& p);              // p.scale or 1/sqrt(d)
int64_t group_size(const Problem& p);           // H_q / H_kv
BURSTLAB_HD int64_t kv_head(int64_t h, int64_t group) { return h / group; }

// Builds the device-usable form of p.mask (validates first).
MaskData compile_mask(const Problem& p);

// Visible (i, j) pairs of one (b, h); the same for every (b, h) (§3).
int64_t visible_pairs(const Problem& p);
// FLOP convention (§8, flash-attention's): forward 4 * B * H_q * visible_pairs * d;
// backward 2.5x forward.
double forward_flops(const Problem& p);
double backward_flops(const Problem& p);

std::string shape_string(const Problem& p);  // "B=1 Hq=4 Hkv=2 Nq=113 Nk=203 d=64"

}  // namespace burstlab

// ---- template definition ----
namespace burstlab {
template <class T>
void validate_views(const Problem& p, const View4<T>& Q, const View4<T>& K, const View4<T>& V) {
  validate(p);
  validate_q_side(p, "Q", Q);
  validate_kv_side(p, "K", K);
  validate_kv_side(p, "V", V);
}
template <class T> void validate_q_side(const Problem& p, const char* name, const View4<T>& v) {
  int64_t e[4];
  expect_q_side(p, e);
  validate_view(name, v.dim, v.data, 4, e);
}
template <class T> void validate_kv_side(const Problem& p, const char* name, const View4<T>& v) {
  int64_t e[4];
  expect_kv_side(p, e);
  validate_view(name, v.dim, v.data, 4, e);
}
template <class T> void validate_rows(const Problem& p, const char* name, const View3<T>& v) {
  int64_t e[3];
  expect_rows(p, e);
  validate_view(name, v.dim, v.data, 3, e);
}
template <class T, class L>
void validate_forward_views(const Problem& p, const View4<const T>& Q, const View4<const T>& K,
                            const View4<const T>& V, const View4<T>& O, const View3<L>& LSE) {
  validate_views(p, Q, K, V);
  validate_q_side(p, "O", O);
  validate_rows(p, "LSE", LSE);
}
template <class T, class L, class G>
void validate_backward_views(const Problem& p, const View4<const T>& Q, const View4<const T>& K,
                             const View4<const T>& V, const View4<const T>& O, const View4<const T>& dO,
                             const View3<L>& LSE, const View4<G>& dQ, const View4<G>& dK, const View4<G>& dV) {
  validate_views(p, Q, K, V);
  validate_q_side(p, "O", O);
  validate_q_side(p, "dO", dO);
  validate_rows(p, "LSE", LSE);
  validate_q_side(p, "dQ", dQ);
  validate_kv_side(p, "dK", dK);
  validate_kv_side(p, "dV", dV);
}
namespace view_check {
template <class V> void block4(const char* name, const V& v, int64_t B, int64_t H, int64_t n, int64_t d) {
  const int64_t e[4] = {B, H, n, d};
  validate_block_view(name, v.dim, v.data, 4, e);
}
template <class V> void block3(const char* name, const V& v, int64_t B, int64_t H, int64_t n) {
  const int64_t e[3] = {B, H, n};
  validate_block_view(name, v.dim, v.data, 3, e);
}
// The inputs both block passes take: Q (B, H_q, nq, d), K, V (B, H_kv, nk, d).
template <class T>
void qkv(const Problem& p, int64_t nq, int64_t nk, const View4<const T>& Q, const View4<const T>& K,
         const View4<const T>& V) {
  block4("Q", Q, p.B, p.H_q, nq, p.d);
  block4("K", K, p.B, p.H_kv, nk, p.d);
  block4("V", V, p.B, p.H_kv, nk, p.d);
}
}  // namespace view_check
template <class T, class L>
void validate_block_forward_views(const Problem& p, int64_t nq, int64_t nk, const View4<const T>& Q,
                                  const View4<const T>& K, const View4<const T>& V, const View4<T>& O,
                                  const View3<L>& LSE) {
  view_check::qkv(p, nq, nk, Q, K, V);
  view_check::block4("O", O, p.B, p.H_q, nq, p.d);
  view_check::block3("LSE", LSE, p.B, p.H_q, nq);
}
template <class T, class L, class G>
void validate_block_backward_views(const Problem& p, int64_t nq, int64_t nk, const View4<const T>& Q,
                                   const View4<const T>& K, const View4<const T>& V,
                                   const View4<const T>& dO, const View3<const L>& LSE,
                                   const View3<const L>& D, const View4<G>& dQ, const View4<G>& dK,
                                   const View4<G>& dV) {
  view_check::qkv(p, nq, nk, Q, K, V);
  view_check::block4("dO", dO, p.B, p.H_q, nq, p.d);
  view_check::block3("LSE", LSE, p.B, p.H_q, nq);
  view_check::block3("D", D, p.B, p.H_q, nq);
  view_check::block4("dQ", dQ, p.B, p.H_q, nq, p.d);
  view_check::block4("dK", dK, p.B, p.H_kv, nk, p.d);
  view_check::block4("dV", dV, p.B, p.H_kv, nk, p.d);
}
}  // namespace burstlab
