// reference/rows.hpp — the row-sampled oracle for huge N (spec §9.11).
// The full oracle holds N_q x N_k per (b, h); at N = 1M that is impossible. This one checks a run
// on K sampled query rows and K sampled key columns, O(K N d) work and no N x N buffer:
//   rows     O_i, LSE_i, dQ_i exactly in fp64 from the inputs (eq. 2.1-2.4, 5.1-5.6), with the
//            §9 bounds of those rows (eq. 9.3, 9.4, 9.9);
//   columns  dK_j, dV_j in fp64 from the inputs and the RUN's own LSE and O (a conditional check,
//            eq. 9.10-9.13): the accumulation and communication of dK, dV given the forward.
// Every mask kind (§3), GQA/MQA (§1.3), empty rows (§2.3). A candidate enters as what the check
// reads of it, SampledOutputs (its values at the sample) and RunRows (its per-row LSE and D for
// the column oracle), so a distributed transport sends only those (tools/gather.cpp); the forms
// over GLOBAL tensors (B, H, N, d) in any layout extract them and call the same code.
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
// A view of any storage type as a Stored4, and Inputs as StoredInputs (no copy).
Stored4 stored4(const AnyView4& v);
StoredInputs stored_inputs(const Inputs& in);
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

// What the column oracle reads of a run's forward: for every q-head of a sampled column's group,
// each row's LSE_i, D_i = rowsum(dO o O)_i (eq. 5.1) and sum_k |dO_ik||O_ik| (eq. 9.11), of the
// run's own O and LSE. O(B H_q N_q), never (B, H_q, N_q, d).
struct RunRows {
  std::vector<int64_t> heads;        // b * H_q + h, ascending: column_heads of the sample
  std::vector<double> LSE, D, Dmag;  // (heads, N_q)
};
// The (b, q-head)s of the sampled columns' groups, b * H_q + h ascending.
std::vector<int64_t> column_heads(const Problem& p, const std::vector<ColumnId>& columns);
// D_i and sum_k |dO_ik||O_ik| of one row from its d values of dO and O: the one summation every
// RunRows uses (global tensors here, a rank's shard in tools/gather.cpp), so both give the same bits.
void row_D(const double* dO, const double* O, int64_t d, double* D, double* Dmag);
// RunRows of a run's GLOBAL O (B, H_q, N_q, d) and LSE (B, H_q, N_q) with the inputs' dO.
RunRows run_rows(const Problem& p, const AnyView4& dO, View4<const double> O, View3<const double> LSE,
                 const std::vector<ColumnId>& columns);
// The column oracle given RunRows (what the forms below call after run_rows).
ColumnOracle column_oracle(const Problem& p, const Inputs& in, const RunRows& run, const std::vector<ColumnId>& columns);
ColumnOracle column_oracle(const Problem& p, const Inputs& in, View4<const double> O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns);

// The column oracle on inputs and a run's O where they lie (bit for bit as on fp64 Inputs).
ColumnOracle column_oracle(const Problem& p, const StoredInputs& in, const Stored4& O, View3<const double> LSE,
                           const std::vector<ColumnId>& columns);

// A candidate's outputs at a sample, in the sample's order: all the sampled check reads of its O,
// LSE, dQ (at the rows) and dK, dV (at the columns); a tensor not fetched stays empty.
struct SampledOutputs {
  std::vector<double> O, LSE, dQ;  // at Sample::rows: (K, d), (K), (K, d)
  std::vector<double> dK, dV;      // at Sample::columns: (K, d)
};
// SampledOutputs of GLOBAL tensors, any layout (a view with null data is skipped); throws when a
// view does not hold a sampled position.
SampledOutputs sampled_outputs(const Sample& s, int64_t d, View4<const double> O, View3<const double> LSE,
                               View4<const double> dQ, View4<const double> dK, View4<const double> dV);

// A candidate at the sampled rows / columns against the oracles, one Metrics per tensor (§9.3;
// first_wrong names global coordinates).
std::vector<Metrics> check_rows_forward(const RowOracle& want, const SampledOutputs& got);
std::vector<Metrics> check_rows_backward(const RowOracle& want, const SampledOutputs& got);
std::vector<Metrics> check_columns(const ColumnOracle& want, const SampledOutputs& got);
// The same on GLOBAL outputs (sampled_outputs, then the above).
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
std::vector<Metrics> check_sampled_forward(const SampledOracle& s, const SampledOutputs& got);
// dQ on the sampled rows; dK, dV on the sampled columns against column_oracle(run) of the
// candidate's own forward.
std::vector<Metrics> check_sampled_backward(const SampledOracle& s, const Problem& p, const Inputs& in,
                                            const RunRows& run, const SampledOutputs& got);
// The same on GLOBAL outputs (sampled_outputs and run_rows, then the above).
std::vector<Metrics> check_sampled_forward(const SampledOracle& s, const Problem& p, View4<const double> O,
                                           View3<const double> LSE);
// dQ on the sampled rows; dK, dV on the sampled columns against column_oracle(O, LSE) of the
// candidate's own forward.
std::vector<Metrics> check_sampled_backward(const SampledOracle& s, const Problem& p, const Inputs& in,
                                            View4<const double> O, View3<const double> LSE,
                                            View4<const double> dQ, View4<const double> dK,
                                            View4<const double> dV);

}  // namespace burstlab
