// tests/cuda/ — the CUDA layer against the fp64 oracle under the spec's tolerance rule (§9):
// every variant and dtype, ragged N, N_q != N_k, every mask kind (conjunctions and fully masked
// rows included), GQA/MQA, adversarial values, BSHD and BHSD; forward_block over contiguous and
// indexed positions with the fold and with the merge kernel; backward and backward_block;
// deterministic mode bitwise repeatable. Outputs are poisoned (NaN) before every run.
// Without a GPU every test skips with a message; with BURSTLAB_REQUIRE_GPU=1 a skip fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "burstlab/dispatch.hpp"
#include "cuda.hpp"
#include "gpu_skip.hpp"
#include "harness.hpp"
#include "testutil.hpp"

namespace {

using namespace burstlab;
namespace bc = burstlab::cuda;
using testutil::make_problem;

// The sweeps run every variant of the table (cuda/variants.hpp) on the cases it supports; a
// variant this GPU cannot run (sm_90a code elsewhere) skips (Auto's choice is asserted separately).
#define REQUIRE_VARIANT(v)                                                                     \
  do {                                                                                         \
    std::string why_v_;                                                                        \
    if (!bc::variant_available(v, &why_v_)) GTEST_SKIP() << why_v_;                            \
  } while (0)

#define REQUIRE_GPU() BURSTLAB_REQUIRE_GPU(bc::gpu_available)

// ---------------------------------------------------------------- host <-> device helpers
template <class T>
struct DT4 {  // device tensor in a layout
  bc::DeviceBuffer<T> buf;
  Layout layout = Layout::BHSD;
  int64_t B = 0, H = 0, N = 0, d = 0;
  View4<T> view() const { return view4(buf.data(), layout, B, H, N, d); }
  View4<const T> cview() const { return as_const(view()); }
};
template <class T>
DT4<T> dev_empty(Layout layout, int64_t B, int64_t H, int64_t N, int64_t d) {
  DT4<T> t;
  t.buf = bc::DeviceBuffer<T>(size_t(B * H * N * d));
  t.layout = layout; t.B = B; t.H = H; t.N = N; t.d = d;
  t.buf.poison();
  return t;
}
template <class T>
DT4<T> to_device(const Tensor4<double>& x) {
  DT4<T> t = dev_empty<T>(x.layout, x.B, x.H, x.N, x.d);
  std::vector<T> h(x.data.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = from_double<T>(x.data[i]);
  t.buf.upload(h.data(), h.size());
  return t;
}
template <class T>
Tensor4<double> to_host(const DT4<T>& t) {
  std::vector<T> h(t.buf.size());
  t.buf.download(h.data(), h.size());
  Tensor4<double> x = make_tensor4<double>(t.layout, t.B, t.H, t.N, t.d);
  for (size_t i = 0; i < h.size(); ++i) x.data[i] = to_double<T>(h[i]);
  return x;
}
template <class A>
struct DT3 {
  bc::DeviceBuffer<A> buf;
  int64_t B = 0, H = 0, N = 0;
  View3<A> view() const { return view3(buf.data(), B, H, N); }
  View3<const A> cview() const { return as_const(view()); }
};
template <class A>
DT3<A> dev_rows(int64_t B, int64_t H, int64_t N) {
  DT3<A> t;
  t.buf = bc::DeviceBuffer<A>(size_t(B * H * N));
  t.B = B; t.H = H; t.N = N;
  t.buf.poison();
  return t;
}
template <class A>
Tensor3<double> to_host(const DT3<A>& t) {
  std::vector<A> h(t.buf.size());
  t.buf.download(h.data(), h.size());
  Tensor3<double> x = make_tensor3<double>(t.B, t.H, t.N);
  for (size_t i = 0; i < h.size(); ++i) x.data[i] = static_cast<double>(h[i]);
  return x;
}

// Rows idx of x (every b, h) as a new tensor of N = idx.size(), same layout.
Tensor4<double> gather(const Tensor4<double>& x, const std::vector<int64_t>& idx) {
  Tensor4<double> y = make_tensor4<double>(x.layout, x.B, x.H, int64_t(idx.size()), x.d);
  const auto vx = x.view();
  auto vy = y.view();
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < idx.size(); ++n)
        for (int64_t k = 0; k < x.d; ++k) vy(b, h, int64_t(n), k) = vx(b, h, idx[n], k);
  return y;
}
void scatter(Tensor4<double>& x, const Tensor4<double>& y, const std::vector<int64_t>& idx) {
  auto vx = x.view();
  const auto vy = y.view();
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < idx.size(); ++n)
        for (int64_t k = 0; k < x.d; ++k) vx(b, h, idx[n], k) = vy(b, h, int64_t(n), k);
}
void scatter(Tensor3<double>& x, const Tensor3<double>& y, const std::vector<int64_t>& idx) {
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (size_t n = 0; n < idx.size(); ++n) x.view()(b, h, idx[n]) = y.view()(b, h, int64_t(n));
}

struct Shape {
  int64_t B, Hq, Hkv, Nq, Nk, d;
};
std::string str(const Shape& s) {
  std::ostringstream os;
  os << "B" << s.B << "_Hq" << s.Hq << "_Hkv" << s.Hkv << "_Nq" << s.Nq << "_Nk" << s.Nk << "_d" << s.d;
  return os.str();
}

// Whether the table says variant v runs this case on the device it names (the test allocates
// views that meet every view rule; the case skips on a GPU that cannot run v).
bool table_runs(bc::Variant v, bc::Pass pass, const std::string& dtype, const Shape& s, const std::string& mask,
                bool q_indexed = false, bool k_indexed = false, bool deterministic = false) {
  const bc::VariantInfo& info = bc::variant_info(v);
  bc::Call c;
  c.pass = pass;
  c.dtype = parse_dtype(dtype);
  c.d = s.d;
  c.N_q = c.n_q = s.Nq;
  c.N_k = c.n_k = s.Nk;
  c.block_sparse = mask.find("block") != std::string::npos;
  c.q_indexed = q_indexed;
  c.k_indexed = k_indexed;
  c.deterministic = deterministic;
  return bc::supports(info, c, info.cc);
}
bool has_pass(const bc::VariantInfo& v, bc::Pass p) {
  return std::find(v.passes.begin(), v.passes.end(), p) != v.passes.end();
}

// ---------------------------------------------------------------- forward sweep
struct FwdCase {
  std::string dtype;  // f64 f32 bf16 f16
  bc::Variant variant;
  Shape shape;
  std::string mask;
  Layout layout;
  Values values;
  uint64_t seed;
};
std::string name_of(const FwdCase& c) {
  const std::string m = testutil::param_name(c.mask);
  return c.dtype + "_" + bc::to_string(c.variant) + "_" + str(c.shape) + "_" + m + "_" +
         to_string(c.layout) + "_" + to_string(c.values);
}
// gtest's name of a case (name_of).
template <class C>
std::string case_name(const ::testing::TestParamInfo<C>& i) {
  return name_of(i.param);
}

const std::vector<std::string> kMasks = {
    "none", "causal", "window:16,0", "window:7,5", "document:4", "block:32x16@0.5",
    "causal+document:3", "window:40,8+block:16x64@0.6", "document:5+block:8x8@0.7"};
const std::vector<Values> kValues = {Values::Normal, Values::Large, Values::Ties, Values::WideV};

const std::vector<Shape> kFwdShapes = {{1, 1, 1, 1, 1, 64},      {2, 4, 2, 113, 203, 64},
                                        {1, 2, 2, 203, 113, 128}, {1, 4, 1, 1023, 1023, 64},
                                        {2, 2, 2, 65, 300, 128},  {1, 3, 3, 257, 129, 128},
                                        {1, 2, 1, 129, 77, 3},    {2, 1, 1, 33, 47, 1},
                                        {1, 2, 2, 70, 90, 100}};
const char* const kDtypes[] = {"f64", "f32", "bf16", "f16"};

std::vector<FwdCase> fwd_cases() {
  std::vector<FwdCase> out;
  uint64_t seed = 100;
  int k = 0;
  const auto add = [&](const char* dt, bc::Variant v, const Shape& s, const std::string& m) {
    out.push_back({dt, v, s, m, (k % 2) ? Layout::BSHD : Layout::BHSD, kValues[k % kValues.size()], seed++});
    ++k;
  };
  // Every variant with a forward, on every dtype, shape and mask it runs (v4 by name refuses
  // block-sparse masks: see Validation).
  for (const bc::VariantInfo* v : bc::variants_by_number())
    for (const char* dt : kDtypes)
      for (const Shape& s : kFwdShapes)
        for (const std::string& m : kMasks)
          if (table_runs(v->id, bc::Pass::Forward, dt, s, m)) add(dt, v->id, s, m);
  // Auto runs a thinner sweep (one of the variants underneath, each swept on its own).
  for (const Shape& s : kFwdShapes)
    for (size_t mi = 0; mi < kMasks.size(); mi += 3) add("f16", bc::Variant::Auto, s, kMasks[mi]);
  return out;
}

template <class T>
void run_fwd_case(const FwdCase& c) {
  using A = acc_t<T>;
  const Shape& s = c.shape;
  Problem p = make_problem(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.d, c.mask, c.seed);
  const Inputs in = as_fp64(make_inputs(p, c.layout, dtype_of<T>(), c.seed, c.values));  // read as Tensor4<double> below
  const Oracle want = run_oracle(p, in, false);
  DT4<T> Q = to_device<T>(in.Q.f64()), K = to_device<T>(in.K.f64()), V = to_device<T>(in.V.f64());
  DT4<T> O = dev_empty<T>(c.layout, s.B, s.Hq, s.Nq, s.d);  // poisoned
  DT3<A> L = dev_rows<A>(s.B, s.Hq, s.Nq);                  // poisoned
  bc::Options opt;
  opt.variant = c.variant;
  bc::forward<T>(p, Q.cview(), K.cview(), V.cview(), O.view(), L.view(), opt);
  BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ms = check_forward<double>(want, to_host(O), to_host(L));
  testutil::expect_pass(ms, name_of(c) + " " + shape_string(p) + " mask=" + describe(p.mask));
}

class CudaForward : public ::testing::TestWithParam<FwdCase> {};
TEST_P(CudaForward, MatchesOracle) {
  REQUIRE_GPU();
  const FwdCase& c = GetParam();
  REQUIRE_VARIANT(c.variant);
  dispatch_dtype(parse_dtype(c.dtype), [&](auto tag) { run_fwd_case<typename decltype(tag)::type>(c); });
}
INSTANTIATE_TEST_SUITE_P(Sweep, CudaForward, ::testing::ValuesIn(fwd_cases()), case_name<FwdCase>);

// ---------------------------------------------------------------- backward sweep
std::vector<FwdCase> bwd_cases() {
  std::vector<FwdCase> out;
  const char* dts[] = {"f64", "f32", "bf16", "f16"};
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 64},     {2, 4, 2, 113, 203, 64},
                                     {1, 2, 2, 203, 113, 128}, {1, 4, 1, 97, 150, 3},
                                     {1, 2, 1, 300, 300, 128}};
  uint64_t seed = 500;
  int k = 0;
  for (const char* dt : dts)
    for (const Shape& s : shapes)
      for (const std::string& m : kMasks) {
        out.push_back({dt, bc::Variant::Auto, s, m, (k % 2) ? Layout::BSHD : Layout::BHSD,
                       kValues[k % kValues.size()], seed++});
        ++k;
      }
  // Every variant with a backward by name, on the 16-bit dtypes and the shapes of the tensor cores.
  const std::vector<Shape> fast = {{1, 1, 1, 1, 1, 64}, {2, 4, 2, 113, 203, 64},
                                   {1, 2, 2, 203, 113, 128}, {1, 2, 1, 300, 300, 128}};
  for (const char* dt : {"bf16", "f16"})
    for (const bc::VariantInfo* v : bc::variants_by_number())
      for (const Shape& s : fast)
        for (const std::string& m : kMasks) {
          if (!table_runs(v->id, bc::Pass::Backward, dt, s, m)) continue;
          out.push_back({dt, v->id, s, m, (k % 2) ? Layout::BSHD : Layout::BHSD, kValues[k % kValues.size()], seed++});
          ++k;
        }
  out.push_back({"bf16", bc::Variant::Auto, {1, 2, 2, 1023, 1023, 64}, "causal", Layout::BSHD, Values::Normal, 777});
  out.push_back({"f32", bc::Variant::Auto, {1, 4, 2, 1023, 511, 128}, "window:100,20", Layout::BHSD, Values::Normal, 778});
  return out;
}

template <class T>
void run_bwd_case(const FwdCase& c, bool deterministic) {
  using A = acc_t<T>;
  const Shape& s = c.shape;
  Problem p = make_problem(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.d, c.mask, c.seed);
  const Inputs in = as_fp64(make_inputs(p, c.layout, dtype_of<T>(), c.seed, c.values));  // read as Tensor4<double> below
  const Oracle want = run_oracle(p, in, true);
  DT4<T> Q = to_device<T>(in.Q.f64()), K = to_device<T>(in.K.f64()), V = to_device<T>(in.V.f64()),
         dO = to_device<T>(in.dO.f64());
  DT4<T> O = dev_empty<T>(c.layout, s.B, s.Hq, s.Nq, s.d);
  DT3<A> L = dev_rows<A>(s.B, s.Hq, s.Nq);
  bc::Options opt;
  opt.deterministic = deterministic;
  bc::forward<T>(p, Q.cview(), K.cview(), V.cview(), O.view(), L.view(), opt);
  DT4<T> dQ = dev_empty<T>(c.layout, s.B, s.Hq, s.Nq, s.d);
  DT4<T> dK = dev_empty<T>(c.layout, s.B, s.Hkv, s.Nk, s.d);
  DT4<T> dV = dev_empty<T>(c.layout, s.B, s.Hkv, s.Nk, s.d);
  opt.variant = c.variant;  // the forward ran auto; the backward runs the case's variant
  bc::backward<T>(p, Q.cview(), K.cview(), V.cview(), O.cview(), dO.cview(), L.cview(), dQ.view(),
                  dK.view(), dV.view(), opt);
  BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string ctx = name_of(c) + " " + shape_string(p) + " mask=" + describe(p.mask);
  testutil::expect_pass(check_forward<double>(want, to_host(O), to_host(L)), ctx + " (forward)");
  testutil::expect_pass(check_backward<double>(want, to_host(dQ), to_host(dK), to_host(dV)), ctx);
  if (deterministic) {  // a second run is bitwise the same
    DT4<T> dQ2 = dev_empty<T>(c.layout, s.B, s.Hq, s.Nq, s.d);
    DT4<T> dK2 = dev_empty<T>(c.layout, s.B, s.Hkv, s.Nk, s.d);
    DT4<T> dV2 = dev_empty<T>(c.layout, s.B, s.Hkv, s.Nk, s.d);
    bc::backward<T>(p, Q.cview(), K.cview(), V.cview(), O.cview(), dO.cview(), L.cview(),
                    dQ2.view(), dK2.view(), dV2.view(), opt);
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    auto same = [](const DT4<T>& a, const DT4<T>& b) {
      std::vector<T> x(a.buf.size()), y(b.buf.size());
      a.buf.download(x.data(), x.size());
      b.buf.download(y.data(), y.size());
      return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
    };
    EXPECT_TRUE(same(dQ, dQ2) && same(dK, dK2) && same(dV, dV2)) << ctx << ": not bitwise repeatable";
  }
}

class CudaBackward : public ::testing::TestWithParam<FwdCase> {};
TEST_P(CudaBackward, MatchesOracle) {
  REQUIRE_GPU();
  const FwdCase& c = GetParam();
  REQUIRE_VARIANT(c.variant);
  // Deterministic where the variant has the mode (v5, v6 and v14 have none).
  const bool det = c.seed % 3 == 0 && (c.variant == bc::Variant::Auto ||
                                       bc::variant_info(c.variant).determinism != bc::Determinism::Never);
  dispatch_dtype(parse_dtype(c.dtype), [&](auto tag) { run_bwd_case<typename decltype(tag)::type>(c, det); });
}
INSTANTIATE_TEST_SUITE_P(Sweep, CudaBackward, ::testing::ValuesIn(bwd_cases()), case_name<FwdCase>);

TEST(CudaBackward, DeterministicBitwiseRepeatable) {
  REQUIRE_GPU();
  run_bwd_case<bf16_t>({"bf16", bc::Variant::Auto, {2, 4, 2, 300, 257, 128}, "causal", Layout::BSHD, Values::Normal, 901}, true);
  // Every variant with a deterministic backward by name, where this GPU runs it.
  const Shape sh{2, 4, 2, 300, 257, 128};
  for (const bc::VariantInfo* v : bc::variants_by_number())
    if (table_runs(v->id, bc::Pass::Backward, "bf16", sh, "causal", false, false, true) && bc::variant_available(v->id))
      run_bwd_case<bf16_t>({"bf16", v->id, sh, "causal", Layout::BSHD, Values::Normal, 902 + 100 * uint64_t(v->id)}, true);
  run_bwd_case<f16_t>({"f16", bc::Variant::Auto, {1, 4, 1, 257, 300, 64}, "window:40,8+block:16x64@0.6", Layout::BHSD, Values::Normal, 904}, true);
  run_bwd_case<float>({"f32", bc::Variant::Auto, {1, 2, 1, 203, 113, 64}, "document:3", Layout::BHSD, Values::Normal, 902}, true);
}

// ---------------------------------------------------------------- blocks (§6) and the merge
struct BlockCase {
  std::string dtype;
  bc::Variant variant;
  Shape shape;
  std::string mask;
  bool q_indexed, k_indexed;  // zigzag-like query order / striped keys
  bool use_merge_kernel;      // partials + merge kernel instead of the fold
  int parts;
  bc::Variant bwd_variant = bc::Variant::Auto;  // backward_block's
  bool deterministic = false;
  bool nonzero_init = false;  // the gradients start from X0 != 0 (accumulate, not overwrite)
};
std::string name_of(const BlockCase& c) {
  const std::string m = testutil::param_name(c.mask);
  return c.dtype + "_" + bc::to_string(c.variant) + "_" + str(c.shape) + "_" + m +
         (c.q_indexed ? "_qidx" : "_qcont") + (c.k_indexed ? "_kidx" : "_kcont") +
         (c.use_merge_kernel ? "_merge" : "_fold") + "_P" + std::to_string(c.parts) +
         (c.bwd_variant != bc::Variant::Auto ? "_bwd" + bc::to_string(c.bwd_variant) : "") +
         (c.deterministic ? "_det" : "") + (c.nonzero_init ? "_init" : "");
}

// Initial gradients for backward_block to accumulate onto: X0 = 3/4 of the oracle's gradient,
// rounded to fp32, where that is non-zero, else 1.5. The fp32 sum X0 + c then rounds by at most
// u_a (|X0| + |c|) <= 2 u_a sum |dS||K| (or the dV analogue), inside the §9 bound, while a
// kernel that overwrote instead of adding would be off by |X0| = 3/4 |grad|; where the gradient
// is 0 (rows or keys that see nothing) X0 + 0 = X0 exactly.
Tensor4<double> initial_grad(const Tensor4<double>& want) {
  Tensor4<double> x = want;
  for (double& v : x.data) v = v != 0 ? double(float(0.75 * v)) : 1.5;
  return x;
}
void subtract(Tensor4<double>& x, const Tensor4<double>& x0) {
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] -= x0.data[i];
}

// Partition [0, N) into `parts` pieces: contiguous ranges, or striped (j % parts) / zigzag.
std::vector<std::vector<int64_t>> split(int64_t N, int parts, bool indexed, bool zigzag) {
  std::vector<std::vector<int64_t>> out(parts);
  for (int64_t j = 0; j < N; ++j) {
    int part;
    if (!indexed) part = int(j * parts / N);
    else if (!zigzag) part = int(j % parts);
    else {  // zigzag over 2*parts chunks
      const int64_t chunk = j * 2 * parts / N;
      part = int(chunk < parts ? chunk : 2 * parts - 1 - chunk);
    }
    out[part].push_back(j);
  }
  return out;
}

template <class T>
void run_block_case(const BlockCase& c) {
  using A = acc_t<T>;
  const Shape& s = c.shape;
  const uint64_t seed = 4242;
  Problem p = make_problem(s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.d, c.mask, seed);
  const Layout layout = Layout::BSHD;
  const Inputs in = as_fp64(make_inputs(p, layout, dtype_of<T>(), seed, Values::Normal));  // read as Tensor4<double> below
  const Oracle want = run_oracle(p, in, true);
  const MaskData md = compile_mask(p);
  const bc::DeviceMask dm(md);
  const auto qparts = split(s.Nq, 2, c.q_indexed, true);
  const auto kparts = split(s.Nk, c.parts, c.k_indexed, false);
  Tensor4<double> O_all = make_tensor4<double>(layout, s.B, s.Hq, s.Nq, s.d);
  Tensor3<double> L_all = make_tensor3<double>(s.B, s.Hq, s.Nq);
  Tensor4<double> dQ_all = make_tensor4<double>(layout, s.B, s.Hq, s.Nq, s.d);
  Tensor4<double> dK_all = make_tensor4<double>(layout, s.B, s.Hkv, s.Nk, s.d);
  Tensor4<double> dV_all = make_tensor4<double>(layout, s.B, s.Hkv, s.Nk, s.d);
  // Key-side blocks, with their position arrays on the device.
  std::vector<DT4<T>> Kb, Vb;
  std::vector<bc::DeviceBuffer<int64_t>> kidx;
  for (const auto& kp : kparts) {
    Kb.push_back(to_device<T>(gather(in.K.f64(), kp)));
    Vb.push_back(to_device<T>(gather(in.V.f64(), kp)));
    kidx.emplace_back(kp.size());
    kidx.back().upload(kp.data(), kp.size());
  }
  // Gradients start from 0, or from X0 (subtracted on the host at the end).
  const Tensor4<double> dQ0 = c.nonzero_init ? initial_grad(want.dQ) : make_tensor4<double>(layout, s.B, s.Hq, s.Nq, s.d);
  const Tensor4<double> dK0 = c.nonzero_init ? initial_grad(want.dK) : make_tensor4<double>(layout, s.B, s.Hkv, s.Nk, s.d);
  const Tensor4<double> dV0 = c.nonzero_init ? initial_grad(want.dV) : make_tensor4<double>(layout, s.B, s.Hkv, s.Nk, s.d);
  std::vector<DT4<A>> dKb, dVb;  // accumulated over query blocks
  for (const auto& kp : kparts) {
    dKb.push_back(to_device<A>(gather(dK0, kp)));
    dVb.push_back(to_device<A>(gather(dV0, kp)));
  }
  bc::Options opt;
  opt.variant = c.variant;
  for (const auto& qp : qparts) {
    const int64_t nq = int64_t(qp.size());
    bc::DeviceBuffer<int64_t> qidx(qp.size());
    qidx.upload(qp.data(), qp.size());
    const Positions qpos = c.q_indexed ? Positions{0, nq, qidx.data()} : contiguous(qp.empty() ? 0 : qp[0], nq);
    DT4<T> Q = to_device<T>(gather(in.Q.f64(), qp)), dO = to_device<T>(gather(in.dO.f64(), qp));
    DT4<T> O = dev_empty<T>(layout, s.B, s.Hq, nq, s.d);
    DT3<A> L = dev_rows<A>(s.B, s.Hq, nq);
    for (size_t kb = 0; kb < kparts.size(); ++kb) {
      const int64_t nk = int64_t(kparts[kb].size());
      const Positions kpos = c.k_indexed ? Positions{0, nk, kidx[kb].data()} : contiguous(kparts[kb].empty() ? 0 : kparts[kb][0], nk);
      if (kb == 0 || !c.use_merge_kernel) {
        bc::forward_block<T>(p, dm.params(), qpos, kpos, Q.cview(), Kb[kb].cview(), Vb[kb].cview(),
                             O.view(), L.view(), kb > 0, opt);
      } else {
        DT4<T> Ob = dev_empty<T>(layout, s.B, s.Hq, nq, s.d);
        DT3<A> Lb = dev_rows<A>(s.B, s.Hq, nq);
        bc::forward_block<T>(p, dm.params(), qpos, kpos, Q.cview(), Kb[kb].cview(), Vb[kb].cview(),
                             Ob.view(), Lb.view(), false, opt);
        bc::merge<T>(O.view(), L.view(), Ob.cview(), Lb.cview(), opt);
        BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
      }
    }
    // Backward blocks with the global row statistics.
    DT3<A> D = dev_rows<A>(s.B, s.Hq, nq);
    bc::compute_D<T>(O.cview(), dO.cview(), D.view(), opt);
    DT4<A> dQ = to_device<A>(gather(dQ0, qp));
    bc::Options bopt;
    bopt.variant = c.bwd_variant;
    bopt.deterministic = c.deterministic;
    for (size_t kb = 0; kb < kparts.size(); ++kb) {
      const int64_t nk = int64_t(kparts[kb].size());
      const Positions kpos = c.k_indexed ? Positions{0, nk, kidx[kb].data()} : contiguous(kparts[kb].empty() ? 0 : kparts[kb][0], nk);
      bc::backward_block<T>(p, dm.params(), qpos, kpos, Q.cview(), Kb[kb].cview(), Vb[kb].cview(),
                            dO.cview(), L.cview(), D.cview(), dQ.view(), dKb[kb].view(),
                            dVb[kb].view(), bopt);
    }
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    scatter(O_all, to_host(O), qp);
    scatter(L_all, to_host(L), qp);
    scatter(dQ_all, to_host(dQ), qp);
  }
  for (size_t kb = 0; kb < kparts.size(); ++kb) {
    scatter(dK_all, to_host(dKb[kb]), kparts[kb]);
    scatter(dV_all, to_host(dVb[kb]), kparts[kb]);
  }
  subtract(dQ_all, dQ0);
  subtract(dK_all, dK0);
  subtract(dV_all, dV0);
  const std::string ctx = name_of(c) + " " + shape_string(p) + " mask=" + describe(p.mask);
  testutil::expect_pass(check_forward<double>(want, O_all, L_all), ctx + " (forward_block)");
  testutil::expect_pass(check_backward<double>(want, dQ_all, dK_all, dV_all), ctx + " (backward_block)");
}

// forward_block by every variant of the table on every case it runs (the backward blocks: auto).
std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> out;
  const char* masks[] = {"none", "causal", "window:20,3+document:3", "block:16x32@0.5"};
  const BlockCase kinds[] = {
      {"f32", bc::Variant::Auto, {1, 2, 1, 150, 203, 64}, "", false, false, false, 3},
      {"f64", bc::Variant::Auto, {1, 2, 2, 113, 97, 3}, "", true, true, true, 2},
      {"bf16", bc::Variant::Auto, {2, 4, 2, 300, 257, 128}, "", false, false, false, 3},
      {"bf16", bc::Variant::Auto, {1, 2, 1, 203, 300, 64}, "", true, true, true, 3},
      {"f16", bc::Variant::Auto, {1, 2, 2, 129, 200, 64}, "", true, false, false, 2},
      {"f16", bc::Variant::Auto, {1, 3, 1, 200, 129, 128}, "", false, true, false, 2}};
  for (const char* m : masks)
    for (const bc::VariantInfo* v : bc::variants_by_number())
      for (BlockCase c : kinds) {
        if (!table_runs(v->id, bc::Pass::ForwardBlock, c.dtype, c.shape, m, c.q_indexed, c.k_indexed)) continue;
        c.variant = v->id;
        c.mask = m;
        out.push_back(c);
      }
  return out;
}

// A block case on its dtype, once a GPU and the variant under test are there (else a skip).
void block_case(const BlockCase& c, bc::Variant under_test) {
  REQUIRE_GPU();
  REQUIRE_VARIANT(under_test);
  dispatch_dtype(parse_dtype(c.dtype), [&](auto tag) { run_block_case<typename decltype(tag)::type>(c); });
}

class CudaBlocks : public ::testing::TestWithParam<BlockCase> {};
TEST_P(CudaBlocks, ComposeToTheWhole) { block_case(GetParam(), GetParam().variant); }
INSTANTIATE_TEST_SUITE_P(Sweep, CudaBlocks, ::testing::ValuesIn(block_cases()), case_name<BlockCase>);

// backward_block on the tensor cores (the table's rows with a backward_block other than the
// fallback, by name in turns, and auto): every mask kind, GQA/MQA, ragged pieces, query and key
// blocks at different global offsets (contiguous pieces, zigzag-indexed queries, striped keys),
// onto zero and non-zero gradients, the one-pass and the deterministic mode; the forward blocks
// run auto. Indexed keys in the deterministic mode run v1 (auto) and make v4 by name throw (see
// Validation).
// The backward_block variant of case i: auto every 4th case (and where no row but the fallback
// runs it), else the rows that run it by turns.
bc::Variant bwd_block_variant(int i, const char* dt, const Shape& s, const std::string& m, bool qidx, bool kidx,
                              bool det) {
  std::vector<bc::Variant> rows;
  for (const bc::VariantInfo* v : bc::variants_by_number())
    if (v != &bc::variants().back() && table_runs(v->id, bc::Pass::BackwardBlock, dt, s, m, qidx, kidx, det))
      rows.push_back(v->id);
  return i % 4 == 3 || rows.empty() ? bc::Variant::Auto : rows[size_t(i) % rows.size()];
}

std::vector<BlockCase> bwd_block_cases() {
  std::vector<BlockCase> out;
  const Shape shapes[] = {{2, 4, 2, 300, 257, 128}, {1, 3, 1, 203, 300, 64}, {1, 2, 2, 3, 130, 64},
                          {1, 2, 1, 129, 200, 128}};
  int k = 0;
  for (const char* dt : {"bf16", "f16"})
    for (const Shape& sh : shapes)
      for (const std::string& m : kMasks)
        for (bool det : {false, true}) {
          const int i = k++ / 2;  // both modes of each (dtype, shape, mask) get the same pieces
          const bool qidx = i % 3 == 1, init = i % 2 == 0;
          const bc::Variant v = bwd_block_variant(i, dt, sh, m, qidx, false, det);
          out.push_back({dt, bc::Variant::Auto, sh, m, qidx, false, false, 2 + (i / 3) % 3, v, det, init});
        }
  // Striped (indexed) keys, one-pass mode, every mask kind; deterministic: auto runs v1.
  int j = 0;
  for (const std::string& m : kMasks) {
    const Shape s1{2, 4, 2, 300, 257, 128}, s2{1, 3, 1, 203, 300, 64};
    out.push_back({"bf16", bc::Variant::Auto, s1, m, j % 2 == 1, true, false, 2 + j % 2,
                   bwd_block_variant(0, "bf16", s1, m, j % 2 == 1, true, false), false, j % 2 == 0});
    out.push_back({"f16", bc::Variant::Auto, s2, m, j % 2 == 0, true, false, 3,
                   bwd_block_variant(j % 3 == 2 ? 3 : 0, "f16", s2, m, j % 2 == 0, true, false), false, j % 2 == 1});
    ++j;
  }
  out.push_back({"bf16", bc::Variant::Auto, {1, 2, 1, 203, 300, 64}, "causal", true, true, false, 3,
                 bc::Variant::Auto, true, true});
  // A longer causal block pair (several 128-key CTAs per block, full and partial tiles).
  const Shape s3{1, 4, 2, 1023, 1023, 128}, s4{1, 2, 2, 1000, 1100, 64};
  out.push_back({"bf16", bc::Variant::Auto, s3, "causal", false, false, false, 4,
                 bwd_block_variant(0, "bf16", s3, "causal", false, false, false), false, true});
  out.push_back({"f16", bc::Variant::Auto, s4, "window:300,0+document:3", true, false, false, 3,
                 bwd_block_variant(0, "f16", s4, "window:300,0+document:3", true, false, true), true, true});
  return out;
}

class CudaBackwardBlock : public ::testing::TestWithParam<BlockCase> {};
TEST_P(CudaBackwardBlock, AccumulatesToTheWhole) { block_case(GetParam(), GetParam().bwd_variant); }
INSTANTIATE_TEST_SUITE_P(Sweep, CudaBackwardBlock, ::testing::ValuesIn(bwd_block_cases()), case_name<BlockCase>);

// Deterministic backward_block: two runs onto the same gradients are bitwise the same, for every
// variant whose backward is repeatable only on request (Options::deterministic).
void run_deterministic_block(bc::Variant variant) {
  using A = float;
  const Problem p = make_problem(1, 4, 2, 300, 500, 128, "causal", 17);
  const Inputs in = as_fp64(make_inputs(p, Layout::BSHD, Dtype::BF16, 17, Values::Normal));  // read as Tensor4<double> below
  const MaskData md = compile_mask(p);
  const bc::DeviceMask dm(md);
  // Rows [100, 300) against keys [128, 450): offsets on both sides; LSE and D arbitrary finite.
  std::vector<int64_t> qi(200), ki(322);
  std::iota(qi.begin(), qi.end(), int64_t(100));
  std::iota(ki.begin(), ki.end(), int64_t(128));
  DT4<bf16_t> Q = to_device<bf16_t>(gather(in.Q.f64(), qi)), dO = to_device<bf16_t>(gather(in.dO.f64(), qi));
  DT4<bf16_t> K = to_device<bf16_t>(gather(in.K.f64(), ki)), V = to_device<bf16_t>(gather(in.V.f64(), ki));
  Tensor3<double> lse = make_tensor3<double>(1, 4, 200), dd = make_tensor3<double>(1, 4, 200);
  for (size_t i = 0; i < lse.data.size(); ++i) { lse.data[i] = 3.0 + 0.01 * double(i % 50); dd.data[i] = 0.1 * double(i % 7); }
  auto rows = [](const Tensor3<double>& x) {
    DT3<A> t = dev_rows<A>(x.B, x.H, x.N);
    std::vector<A> h(x.data.begin(), x.data.end());
    t.buf.upload(h.data(), h.size());
    return t;
  };
  const DT3<A> L = rows(lse), D = rows(dd);
  bc::Options opt;
  opt.variant = variant;
  opt.deterministic = true;
  std::vector<std::vector<A>> got;
  for (int rep = 0; rep < 2; ++rep) {
    DT4<A> dQ = to_device<A>(initial_grad(gather(in.Q.f64(), qi))), dK = to_device<A>(initial_grad(gather(in.K.f64(), ki))),
           dV = to_device<A>(initial_grad(gather(in.V.f64(), ki)));
    bc::backward_block<bf16_t>(p, dm.params(), contiguous(100, 200), contiguous(128, 322), Q.cview(), K.cview(),
                                 V.cview(), dO.cview(), L.cview(), D.cview(), dQ.view(), dK.view(), dV.view(), opt);
    BURSTLAB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<A> all;
    for (const DT4<A>* t : {&dQ, &dK, &dV}) {
      std::vector<A> h(t->buf.size());
      t->buf.download(h.data(), h.size());
      all.insert(all.end(), h.begin(), h.end());
    }
    got.push_back(all);
  }
  EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(A)))
      << bc::to_string(variant) << ": not bitwise repeatable";
}
TEST(CudaBackwardBlock, DeterministicBitwiseRepeatable) {
  REQUIRE_GPU();
  int ran = 0;
  for (const bc::VariantInfo* v : bc::variants_by_number())
    if (has_pass(*v, bc::Pass::BackwardBlock) && v->determinism == bc::Determinism::OnRequest &&
        bc::variant_available(v->id)) {
      run_deterministic_block(v->id);
      ++ran;
    }
  if (ran == 0) GTEST_SKIP() << "no variant with an on-request deterministic backward_block runs on this GPU";
}

// ---------------------------------------------------------------- validation (no GPU needed)
TEST(CudaValidation, BadShapesThrowBeforeLaunch) {
  Problem p;
  p.B = 1; p.H_q = 6; p.H_kv = 4; p.N_q = 8; p.N_k = 8; p.d = 64;
  float dummy[4];
  View4<const float> q = view4<const float>(dummy, Layout::BHSD, 1, 6, 8, 64);
  View4<const float> k = view4<const float>(dummy, Layout::BHSD, 1, 4, 8, 64);
  View4<float> o = view4<float>(dummy, Layout::BHSD, 1, 6, 8, 64);
  View3<float> l = view3<float>(dummy, 1, 6, 8);
  try {
    bc::forward<float>(p, q, k, k, o, l);
    FAIL() << "expected burstlab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_q (6)"), std::string::npos) << e.what();
  }
  p = make_problem(1, 2, 2, 8, 8, 64);
  View4<const float> qbad = view4<const float>(dummy, Layout::BHSD, 1, 2, 5, 64);
  View4<const float> k2 = view4<const float>(dummy, Layout::BHSD, 1, 2, 8, 64);
  View4<float> o2 = view4<float>(dummy, Layout::BHSD, 1, 2, 8, 64);
  View3<float> l2 = view3<float>(dummy, 1, 2, 8);
  EXPECT_THROW(bc::forward<float>(p, qbad, k2, k2, o2, l2), Error);
  bc::Options v2;
  v2.variant = bc::Variant::V2;
  View4<const float> q2 = view4<const float>(dummy, Layout::BHSD, 1, 2, 8, 64);
  try {
    bc::forward<float>(p, q2, k2, k2, o2, l2, v2);  // v2 is bf16/fp16 only
    FAIL() << "expected burstlab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("variant (v2)"), std::string::npos) << e.what();
  }
  Problem pd = make_problem(1, 1, 1, 8, 8, 2000);
  View4<const float> qd = view4<const float>(dummy, Layout::BHSD, 1, 1, 8, 2000);
  View4<float> od = view4<float>(dummy, Layout::BHSD, 1, 1, 8, 2000);
  View3<float> ld = view3<float>(dummy, 1, 1, 8);
  EXPECT_THROW(bc::forward<float>(pd, qd, qd, qd, od, ld), Error);
  EXPECT_THROW(bc::parse_variant("v9"), Error);
  EXPECT_EQ(bc::parse_variant("v3"), bc::Variant::V3);
  EXPECT_EQ(bc::parse_variant("v4"), bc::Variant::V4);
}

TEST(CudaValidation, AutoPicksTensorCoresOnlyWhereTheyApply) {
  Problem p = make_problem(1, 2, 2, 8, 8, 64);
  alignas(16) static bf16_t buf[2 * 8 * 128];
  auto v = [&](int64_t d) { return view4<const bf16_t>(buf, Layout::BHSD, 1, 2, 8, d); };
  auto o = [&](int64_t d) { return view4<bf16_t>(buf, Layout::BHSD, 1, 2, 8, d); };
  // v3 exactly on a compute capability 9.0 device (asked of the runtime here, not of the API).
  int dev = 0, major = 0, minor = 0;
  const bool hopper = bc::gpu_available() && cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                      major == 9 && minor == 0;
  EXPECT_EQ(bc::variant_available(bc::Variant::V3), hopper);
  EXPECT_EQ(bc::variant_available(bc::Variant::V4), hopper);
  EXPECT_EQ(bc::forward_variant<bf16_t>(p, v(64), v(64), v(64), o(64), bc::Variant::Auto),
            hopper ? bc::Variant::V4 : bc::Variant::V2);
  // A block-sparse mask keeps auto on v3 (v4's producer cannot vote on tiles), and v4 by name refuses it.
  Problem pb = make_problem(1, 2, 2, 8, 8, 64, "block:4x4@0.5", 1);
  EXPECT_EQ(bc::forward_variant<bf16_t>(pb, v(64), v(64), v(64), o(64), bc::Variant::Auto),
            hopper ? bc::Variant::V3 : bc::Variant::V2);
  try {
    bc::forward_variant<bf16_t>(pb, v(64), v(64), v(64), o(64), bc::Variant::V4);
    ADD_FAILURE() << "expected burstlab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("variant (v4)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bc::forward_variant<bf16_t>(p, v(64), v(64), v(64), o(64), bc::Variant::V2), bc::Variant::V2);
  if (!hopper) {
    try {
      bc::forward_variant<bf16_t>(p, v(64), v(64), v(64), o(64), bc::Variant::V3);
      ADD_FAILURE() << "expected burstlab::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("variant (v3)"), std::string::npos) << e.what();
    }
  }
  // The backward (not deterministic) at d = 64: v14 on compute capability 9.0 (block masks
  // included), else v2; v1 by name.
  EXPECT_EQ(bc::backward_variant<bf16_t>(p, v(64), v(64), v(64), v(64), v(64), o(64), o(64), o(64), bc::Variant::Auto, false),
            hopper ? bc::Variant::V14 : bc::Variant::V2);
  EXPECT_EQ(bc::backward_variant<bf16_t>(pb, v(64), v(64), v(64), v(64), v(64), o(64), o(64), o(64), bc::Variant::Auto, false),
            hopper ? bc::Variant::V14 : bc::Variant::V2);
  EXPECT_EQ(bc::backward_variant<bf16_t>(p, v(64), v(64), v(64), v(64), v(64), o(64), o(64), o(64), bc::Variant::V1, false),
            bc::Variant::V1);
  // Deterministic: v4's two passes on 9.0 (v14 has no deterministic mode), v2 elsewhere.
  EXPECT_EQ(bc::backward_variant<bf16_t>(p, v(64), v(64), v(64), v(64), v(64), o(64), o(64), o(64), bc::Variant::Auto, true),
            hopper ? bc::Variant::V4 : bc::Variant::V2);
  if (!hopper) {
    EXPECT_THROW(bc::backward_variant<bf16_t>(p, v(64), v(64), v(64), v(64), v(64), o(64), o(64), o(64), bc::Variant::V4, false),
                 Error);
  }
  // backward_block: v4 on compute capability 9.0 (block masks included) with contiguous keys,
  // else v1; v2 and v3 have none.
  alignas(16) static float gbuf[2 * 8 * 128];
  auto gv = [&](int64_t d) { return view4<float>(gbuf, Layout::BHSD, 1, 2, 8, d); };
  int64_t kidx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const Positions q8 = contiguous(0, 8), k8 = contiguous(0, 8), k8i{0, 8, kidx};
  const auto bbv = [&](const Problem& pp, Positions k, bc::Variant r, bool det, std::string* why = nullptr) {
    return bc::backward_block_variant<bf16_t>(pp, q8, k, v(64), v(64), v(64), v(64), gv(64), gv(64), gv(64), r,
                                                det, why);
  };
  const bc::Variant v4_or_v1 = hopper ? bc::Variant::V4 : bc::Variant::V1;
  EXPECT_EQ(bbv(p, k8, bc::Variant::Auto, false), v4_or_v1);
  EXPECT_EQ(bbv(p, k8, bc::Variant::Auto, true), v4_or_v1);
  EXPECT_EQ(bbv(pb, k8, bc::Variant::Auto, false), v4_or_v1);
  EXPECT_EQ(bbv(p, k8i, bc::Variant::Auto, false), v4_or_v1);  // indexed keys: the one-pass mode
  std::string why_b;
  EXPECT_EQ(bbv(p, k8i, bc::Variant::Auto, true, &why_b), bc::Variant::V1);
  EXPECT_NE(why_b.find("contiguous key positions"), std::string::npos) << why_b;
  EXPECT_THROW(bbv(p, k8i, bc::Variant::V4, true), Error);
  EXPECT_THROW(bbv(p, k8, bc::Variant::V3, false), Error);
  EXPECT_EQ(bbv(p, k8, bc::Variant::V1, false), bc::Variant::V1);
  {
    alignas(16) static float fbuf[2 * 8 * 64];
    const View4<const float> f = view4<const float>(fbuf, Layout::BHSD, 1, 2, 8, 64);
    EXPECT_EQ(bc::backward_block_variant<float>(p, q8, k8, f, f, f, f, gv(64), gv(64), gv(64), bc::Variant::Auto,
                                                false),
              bc::Variant::V1);
  }
  Problem p3 = make_problem(1, 2, 2, 8, 8, 3);
  std::string why;
  EXPECT_EQ(bc::forward_variant<bf16_t>(p3, v(3), v(3), v(3), o(3), bc::Variant::Auto, &why), bc::Variant::V1);
  EXPECT_NE(why.find("d in {64, 128}"), std::string::npos) << why;
  why.clear();
  EXPECT_EQ(bc::backward_variant<bf16_t>(p3, v(3), v(3), v(3), v(3), v(3), o(3), o(3), o(3), bc::Variant::Auto, false, &why),
            bc::Variant::V1);
  EXPECT_NE(why.find("d in {64, 128}"), std::string::npos) << why;
}

}  // namespace
