// reference/rows.hpp — the row-sampled oracle for huge N (spec §9.11).
// The full oracle holds N_q x N_k per (b, h); at N = 1M that is impossible. This one checks a run
// on K sampled query rows and K sampled key columns, O(K N d) work and no N x N buffer:
//   rows     O_i, LSE_i, dQ_i exactly in fp64 from the inputs (eq. 2.1-2.4, 5.1-5.6), with the
//            §9 bounds of those rows (eq. 9.3, 9.4, 9.9);
//   columns  dK_j, dV_j in fp64 from the inputs and the RUN's own LSE and O (a conditional check,
//            eq. 9.10-9.13): the accumulation and communication of dK, dV given the forward.
// Every mask kind (§3), GQA/MQA (§1.3), empty rows (§2.3). Candidates are passed as GLOBAL
// tensors (B, H, N, d) in any layout: a distributed transport gathers its ranks' shards first.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "burstlab/precision.hpp"
#include "burstlab/problem.hpp"
#include "burstlab/tensor.hpp"
#include "harness.hpp"
#include "tolerance.hpp"

namespace burstlab {

struct RowId {     // a query row: q-head h
  int64_t b, h, i;
};
struct ColumnId {  // a key column: kv-head h
  int64_t b, h, j;
};

// K rows of (B, H_q, N_q) and K columns of (B, H_kv, N_k) (all of them when there are fewer),
// seeded, sorted, distinct (§9.11): the first and last position, the first row that sees no key
// and the first key no row sees (when the mask has them) plus one more of each at random, half
// of K evenly spaced over the flattened (b, h, position) index, the rest uniformly at random.
struct Sample {
  std::vector<RowId> rows;
  std::vector<ColumnId> columns;
};
Sample choose_sample(const Problem& p, int64_t K, uint64_t seed);

// The fp64 oracle on sampled rows, from the inputs, and the §9 bounds of a candidate of
// in.dtype. Arrays are (n, d) row-major or (n) over `rows`. backward = false: dQ left empty.
struct RowOracle {
  std::vector<RowId> rows;
  std::vector<double> O, LSE, dQ;                    // (n, d), (n), (n, d)
  std::vector<double> bound_O, bound_LSE, bound_dQ;  // eq. (9.3), (9.4), (9.9)
};
RowOracle row_oracle(const Problem& p, const Inputs& in, const std::vector<RowId>& rows, bool backward);

// A read-only 4-D tensor where it lies, in its storage precision (fp64, fp32, bf16, fp16) and
// with any byte strides (negative too), seen in the logical order (b, h, n, k): each element is
// widened to fp64 (exactly) as it is read. The sampled oracle reads K rows and K columns' worth
// of its inputs, so a caller holding bf16 tensors (Python) needs no fp64 copy of them.
struct Stored4 {
  const char* base = nullptr;
  Dtype dtype = Dtype::F64;
  int64_t dim[4] = {0, 0, 0, 0};
  int64_t bytes[4] = {0, 0, 0, 0};  // byte strides of (b, h, n, k)
  double operator()(int64_t b, int64_t h, int64_t n, int64_t k) const {
    const char* x = base + (b * bytes[0] + h * bytes[1] + n * bytes[2] + k * bytes[3]);
    switch (dtype) {
      case Dtype::F64: { double v; std::memcpy(&v, x, 8); return v; }
      case Dtype::F32: { float v; std::memcpy(&v, x, 4); return v; }
      case Dtype::BF16: {
        uint16_t h16;
        std::memcpy(&h16, x, 2);
        const uint32_t w = uint32_t(h16) << 16;
        float v;
        std::memcpy(&v, &w, 4);
        return v;
      }
      case Dtype::F16: { uint16_t h16; std::memcpy(&h16, x, 2); return half_to_double(h16); }
    }
    return 0;
  }
  static double half_to_double(uint16_t h16) {
    const int e = (h16 >> 10) & 0x1f, m = h16 & 0x3ff;
    const double s = (h16 & 0x8000) ? -1.0 : 1.0;
    if (e == 0) return s * std::ldexp(double(m), -24);
    if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
    return s * std::ldexp(double(m + 1024), e - 25);
  }
};
// The inputs as they lie (dO: base null when there is no backward); dtype is the candidate's
// precision, whose §9 bounds the oracles compute (as Inputs::dtype).
struct StoredInputs {
  Dtype dtype = Dtype::F64;
  Stored4 Q, K, V, dO;
};
// The row oracle on inputs where they lie: the same arithmetic, bit for bit, as on fp64 Inputs
// holding the same values.
RowOracle row_oracle(const Problem& p, const StoredInputs& in, const std::vector<RowId>& rows, bool backward);

// dK_j, dV_j of sampled columns (summed over the group, eq. 5.3, 5.7) from the inputs and the
// run's O (B, H_q, N_q, d) and LSE (B, H_q, N_q), and their conditional bounds (eq. 9.10-9.13).
struct ColumnOracle {
  std::vector<ColumnId> columns;
  std::vector<double> dK, dV;              // (n, d)
  std::vector<double> bound_dK, bound_dV;  // (n, d)
};
ColumnOracle column_oracle(const Problem& p, const Inputs& in, View4<const double> O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns);

// The column oracle on inputs and a run's O where they lie (bit for bit as on fp64 Inputs).
ColumnOracle column_oracle(const Problem& p, const StoredInputs& in, const Stored4& O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns);

// A candidate's GLOBAL outputs at the sampled rows / columns against the oracles, one Metrics per
// tensor (§9.3; first_wrong names global coordinates).
std::vector<Metrics> check_rows_forward(const RowOracle& want, View4<const double> O, View3<const double> LSE);
std::vector<Metrics> check_rows_backward(const RowOracle& want, View4<const double> dQ);
std::vector<Metrics> check_columns(const ColumnOracle& want, View4<const double> dK, View4<const double> dV);

// What a transport calls once it holds a candidate's global outputs: the sample and its row
// oracle are computed once per problem (sampled_oracle), then each candidate is checked.
struct SampledOracle {
  Sample sample;
  RowOracle rows;
};
SampledOracle sampled_oracle(const Problem& p, const Inputs& in, int64_t K, uint64_t seed, bool backward);
// O, LSE on the sampled rows.
std::vector<Metrics> check_sampled_forward(const SampledOracle& s, const Problem& p, View4<const double> O,
                                           View3<const double> LSE);
// dQ on the sampled rows; dK, dV on the sampled columns against column_oracle(O, LSE) of the
// candidate's own forward.
std::vector<Metrics> check_sampled_backward(const SampledOracle& s, const Problem& p, const Inputs& in,
                                            View4<const double> O, View3<const double> LSE,
                                            View4<const double> dQ, View4<const double> dK,
                                            View4<const double> dV);

}  // namespace burstlab
