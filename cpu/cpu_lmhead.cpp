// cpu/cpu_lmhead.cpp — the fused LM head + cross-entropy on a CPU (spec §10.5, BurstEngine
// Algorithm 3). For each tile of Br rows:
//   region 1, parallel over vocabulary tiles t:  Z[:, J_t] = H_rows W_t^T (eq. 10.1) into a
//            Br x V accumulator buffer, with each row's partial (m_t, s_t), its target logit and
//            sum_j z_ij (for label smoothing);
//   merge, serial over the rows: LSE by the running form (10.10) over the tiles in order, and
//            the row losses (10.3) summed in row order;
//   region 2 (backward and fused), parallel over vocabulary tiles: dz in place of Z (10.7), then
//            dW_t += dz_t^T H_rows (the thread owns dW_t) and dH_rows += dz_t W_t into a per-thread
//            partial, the partials summed in thread order into dH (10.8)-(10.9).
// The fused call computes each logit once; the separate backward recomputes region 1 from the
// given LSE. Memory beyond the arguments (lmhead_workspace_bytes): Br x V + per thread Br x d, and
// for 16-bit storage (or non-unit column strides) an fp32 copy of W and an fp32 dW accumulator.
//
// Determinism: no atomics. L, LSE and dW do not depend on the thread count (fixed tiles, merges
// in tile order); dH sums the per-thread partials in thread order, so it is bitwise repeatable
// for a fixed thread count. The GEMMs run serial inside the regions (see cpu.cpp).
#include "cpu_lmhead.hpp"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "burstlab/error.hpp"
#include "burstlab/parallel.hpp"

namespace burstlab::cpu {

void validate_tiles(const LmHeadTiles& t) {
  if (t.Br < 1) fail("Br (", t.Br, ") must be >= 1");
  if (t.Bv < 1) fail("Bv (", t.Bv, ") must be >= 1");
}

namespace {

template <class A>
using Mat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using MapM = Eigen::Map<Mat<A>, 0, Eigen::OuterStride<>>;
template <class A>
using MapC = Eigen::Map<const Mat<A>, 0, Eigen::OuterStride<>>;
// Aligned like cpu.cpp's scratch: Eigen peels unaligned heads of reductions, so aligned buffers
// keep the summation order, and the last bits, the same from run to run.
template <class A>
using AVec = std::vector<A, Eigen::aligned_allocator<A>>;

enum class Mode { Forward, Backward, Fused };

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class T>
inline acc_t<T> load(T x) {
  return static_cast<acc_t<T>>(x);
}
template <class T, class A>
inline T store(A x) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}

// Rows of v are unit-stride and do not overlap: usable in place as a row-major matrix.
template <class T>
bool row_major(const View2<T>& v) {
  return v.stride[1] == 1 && (v.dim[0] == 1 || v.stride[0] >= v.dim[1]);
}

template <class T>
acc_t<T> run(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g, Mode mode,
              const acc_t<T>* LSE_in, acc_t<T>* LSE_out, View2<T> dH, View2<T> dW, LmHeadTiles tiles) {
  using A = acc_t<T>;
  const int64_t N = p.N, d = p.d, V = p.V;
  const bool bwd = mode != Mode::Forward, partials = mode != Mode::Backward;
  const int64_t Br = std::min(tiles.Br, N), Bv = std::min(tiles.Bv, V), n_vt = ceil_div(V, Bv);
  const int64_t n_R = counted_rows(p, y);
  const A c = static_cast<A>(g * loss_weight(p, n_R));  // c_i on the counted rows (eq. 10.5)
  const A eps = static_cast<A>(p.label_smoothing), lam = static_cast<A>(p.z_loss);
  const A smooth = eps / static_cast<A>(V), keep = A(1) - eps;

  // W (V, d) as a row-major A matrix: in place when T is A and its rows are unit-stride.
  AVec<A> Wbuf;
  const A* Wp = nullptr;
  int64_t ldw = d;
  if constexpr (std::is_same_v<T, A>) {
    if (row_major(W)) {
      Wp = W.data;
      ldw = V == 1 ? d : W.stride[0];
    }
  }
  if (!Wp) {
    Wbuf.resize(static_cast<size_t>(V * d));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < V; ++j)
      for (int64_t k = 0; k < d; ++k) Wbuf[j * d + k] = load(W(j, k));
    Wp = Wbuf.data();
  }
  // dW accumulator (V, d): dW itself when T is A and its rows are unit-stride.
  AVec<A> dWbuf;
  A* dWp = nullptr;
  int64_t lddw = d;
  if (bwd) {
    if constexpr (std::is_same_v<T, A>) {
      if (row_major(dW)) {
        dWp = dW.data;
        lddw = V == 1 ? d : dW.stride[0];
      }
    }
    if (!dWp) {
      dWbuf.resize(static_cast<size_t>(V * d));
      dWp = dWbuf.data();
    }
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < V; ++j) std::fill(dWp + j * lddw, dWp + j * lddw + d, A(0));
  }

  const int threads = omp_get_max_threads();
  AVec<A> Z(static_cast<size_t>(Br * V));  // (Br, V): logits of the row tile, then dz
  AVec<A> Hc(static_cast<size_t>(Br * d));  // (Br, d): the row tile of H in A
  AVec<A> pm, ps, pz;                       // (Br, n_vt): partials (m_t, s_t), tile sums of z
  if (partials) {
    pm.resize(static_cast<size_t>(Br * n_vt));
    ps.resize(static_cast<size_t>(Br * n_vt));
    if (eps != A(0)) pz.resize(static_cast<size_t>(Br * n_vt));
  }
  AVec<A> tz(static_cast<size_t>(Br)), Lr(static_cast<size_t>(Br));  // target logits, LSE of the tile
  AVec<A> dHp(bwd ? static_cast<size_t>(threads * Br * d) : 0);      // (threads, Br, d)

  const A ninf = -std::numeric_limits<A>::infinity();
  A loss_sum = 0;  // sum_{i in R} l_i, in row order
  FirstError err;
  for (int64_t i0 = 0; i0 < N; i0 += Br) {
    const int64_t rows = std::min(Br, N - i0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < d; ++k) Hc[r * d + k] = load(H(i0 + r, k));
    const MapC<A> Hm(Hc.data(), rows, d, Eigen::OuterStride<>(d));

    // Region 1: logits and partials, one vocabulary tile per iteration.
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n_vt; ++t) err.run([&] {
      const int64_t j0 = t * Bv, nb = std::min(Bv, V - j0);
      const MapC<A> Wt(Wp + j0 * ldw, nb, d, Eigen::OuterStride<>(ldw));  // (nb, d)
      MapM<A> Zt(Z.data() + j0, rows, nb, Eigen::OuterStride<>(V));        // (rows, nb)
      Zt.noalias() = Hm * Wt.transpose();                                   // eq. (10.1)
      if (!partials) return;
      for (int64_t r = 0; r < rows; ++r) {
        const A m = Zt.row(r).maxCoeff();
        pm[r * n_vt + t] = m;
        ps[r * n_vt + t] = (Zt.row(r).array() - m).exp().sum();
        if (eps != A(0)) pz[r * n_vt + t] = Zt.row(r).sum();
        const int64_t yi = y[i0 + r];
        if (yi != p.ignore_index && yi >= j0 && yi < j0 + nb) tz[r] = Zt(r, yi - j0);
      }
    });
    err.rethrow();

    // Merge: eq. (10.10) over the tiles in order, then the row losses (10.3).
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      if (!partials) {
        Lr[r] = LSE_in[i];
        continue;
      }
      A m = ninf, s = 0;
      for (int64_t t = 0; t < n_vt; ++t) {
        const A mt = pm[r * n_vt + t], mn = std::max(m, mt);
        s = (m == ninf ? A(0) : s * std::exp(m - mn)) + ps[r * n_vt + t] * std::exp(mt - mn);
        m = mn;
      }
      const A L = m + std::log(s);
      Lr[r] = L;
      LSE_out[i] = L;
      if (y[i] == p.ignore_index) continue;
      A zsum = 0;
      if (eps != A(0))
        for (int64_t t = 0; t < n_vt; ++t) zsum += pz[r * n_vt + t];
      loss_sum += L - keep * tz[r] - smooth * zsum + lam * L * L;
    }
    if (!bwd) continue;

    // Region 2: dz in place, dW_t += dz_t^T H_rows, per-thread dH_rows += dz_t W_t.
#pragma omp parallel
    {
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      A* dh = dHp.data() + static_cast<size_t>(tid) * Br * d;
      std::fill(dh, dh + rows * d, A(0));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < n_vt; ++t) err.run([&] {
        const int64_t j0 = t * Bv, nb = std::min(Bv, V - j0);
        const MapC<A> Wt(Wp + j0 * ldw, nb, d, Eigen::OuterStride<>(ldw));  // (nb, d)
        MapM<A> Zt(Z.data() + j0, rows, nb, Eigen::OuterStride<>(V));        // (rows, nb)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t yi = y[i0 + r];
          if (yi == p.ignore_index) {  // c_i = 0: exact zeros
            Zt.row(r).setZero();
            continue;
          }
          const A q = c * (A(1) + A(2) * lam * Lr[r]);
          Zt.row(r) = q * (Zt.row(r).array() - Lr[r]).exp() - c * smooth;  // eq. (10.6)-(10.7)
          if (yi >= j0 && yi < j0 + nb) Zt(r, yi - j0) -= c * keep;
        }
        MapM<A> dWt(dWp + j0 * lddw, nb, d, Eigen::OuterStride<>(lddw));
        dWt.noalias() += Zt.transpose() * Hm;  // eq. (10.9)
        MapM<A> dht(dh, rows, d, Eigen::OuterStride<>(d));
        dht.noalias() += Zt * Wt;              // eq. (10.8), this thread's tiles
      });
      // Sum the partials in thread order (implicit barrier above: every partial is complete).
#pragma omp for schedule(static)
      for (int64_t e = 0; e < rows * d; ++e) {
        A s = 0;
        for (int u = 0; u < nt; ++u) s += dHp[static_cast<size_t>(u) * Br * d + e];
        dH(i0 + e / d, e % d) = store<T>(s);
      }
    }
    err.rethrow();
  }
  if (bwd && !dWbuf.empty()) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < V; ++j)
      for (int64_t k = 0; k < d; ++k) dW(j, k) = store<T>(dWbuf[j * d + k]);
  }
  return static_cast<A>(loss_weight(p, n_R)) * loss_sum;  // eq. (10.4)
}

}  // namespace

template <class T>
acc_t<T> lmhead_forward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, acc_t<T>* LSE,
                        LmHeadTiles tiles) {
  validate_tiles(tiles);
  validate_lmhead_forward(p, H, W, y, LSE);
  return run<T>(p, H, W, y, 0.0, Mode::Forward, nullptr, LSE, View2<T>(), View2<T>(), tiles);
}

template <class T>
void lmhead_backward(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y,
                     const acc_t<T>* LSE, double g, View2<T> dH, View2<T> dW, LmHeadTiles tiles) {
  validate_tiles(tiles);
  validate_lmhead_backward(p, H, W, y, LSE, g, dH, dW);
  run<T>(p, H, W, y, g, Mode::Backward, LSE, nullptr, dH, dW, tiles);
}

template <class T>
acc_t<T> lmhead_fused(const LmHeadProblem& p, View2<const T> H, View2<const T> W, const int64_t* y, double g,
                      acc_t<T>* LSE, View2<T> dH, View2<T> dW, LmHeadTiles tiles) {
  validate_tiles(tiles);
  validate_lmhead_backward(p, H, W, y, LSE, g, dH, dW);
  return run<T>(p, H, W, y, g, Mode::Fused, nullptr, LSE, dH, dW, tiles);
}

int64_t lmhead_workspace_bytes(const LmHeadProblem& p, Dtype dtype, bool backward, LmHeadTiles tiles, int threads) {
  validate(p);
  validate_tiles(tiles);
  const int64_t a = dtype == Dtype::F64 ? 8 : 4;
  const int64_t Br = std::min(tiles.Br, p.N), Bv = std::min(tiles.Bv, p.V), n_vt = ceil_div(p.V, Bv);
  int64_t n = Br * p.V + Br * p.d + 3 * Br * n_vt + 2 * Br;  // Z, Hc, partials, tz, Lr
  const int64_t T = std::max(threads, 1);
  if (backward) n += T * Br * p.d;
  // Eigen packs blocks of both operands of each tile GEMM, at most the operands themselves:
  // Br x Bv + Bv x d + Br x d per thread bounds every one of the three products.
  n += T * (Br * Bv + Bv * p.d + Br * p.d);
  const bool sixteen = dtype == Dtype::BF16 || dtype == Dtype::F16;
  if (sixteen) n += p.V * p.d * (backward ? 2 : 1);  // fp32 copy of W, fp32 dW accumulator
  return n * a;
}

#define BURSTLAB_LMHEAD_INSTANTIATE(T)                                                                        \
  template acc_t<T> lmhead_forward<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*,   \
                                      acc_t<T>*, LmHeadTiles);                                                \
  template void lmhead_backward<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*,      \
                                   const acc_t<T>*, double, View2<T>, View2<T>, LmHeadTiles);                 \
  template acc_t<T> lmhead_fused<T>(const LmHeadProblem&, View2<const T>, View2<const T>, const int64_t*,     \
                                    double, acc_t<T>*, View2<T>, View2<T>, LmHeadTiles);

BURSTLAB_LMHEAD_INSTANTIATE(double)
BURSTLAB_LMHEAD_INSTANTIATE(float)
BURSTLAB_LMHEAD_INSTANTIATE(bf16_t)
BURSTLAB_LMHEAD_INSTANTIATE(f16_t)

}  // namespace burstlab::cpu
