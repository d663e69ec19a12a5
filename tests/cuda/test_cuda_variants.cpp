// tests/cuda/test_cuda_variants.cpp — the CUDA variant table and dispatch over it
// (cuda/variants.hpp), and v4's tile order (cuda/tile_scheduler.cuh), on the CPU: no GPU, no
// CUDA runtime. The table's names and order are consistent; `auto` is the first row that
// supports a call, and agrees on random calls with the dispatch rules written out by hand
// below; explicit variants that cannot run a call throw naming themselves; cuda/README.md holds
// the table verbatim; the tile order is a permutation of the work items and the persistent
// grid's hand-out runs each item exactly once; v4's forward takes the shape the documents name
// for each shape of the benchmark grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "burstlab/error.hpp"
#include "fwd_shape.hpp"
#include "tile_scheduler.cuh"
#include "variants.hpp"

namespace {

using namespace burstlab;
using namespace burstlab::cuda;

constexpr int kHopper = 90, kAmpere = 80, kNoGpu = 0;

// Views of a call: aligned (data at 1024, BSHD-like strides in multiples of 8) unless told.
ViewDesc view(const char* name, int64_t d, uintptr_t data = 1024, int64_t d_stride = 1) {
  return {name, data, {8 * 1024 * d, 8 * d, 8 * d, d_stride}};
}

Call make_call(Pass pass, Dtype t, int64_t d, bool block_sparse = false) {
  Call c;
  c.pass = pass;
  c.dtype = t;
  c.d = d;
  c.N_q = 300;
  c.N_k = 257;
  c.n_q = pass == Pass::ForwardBlock || pass == Pass::BackwardBlock ? 150 : 300;
  c.n_k = pass == Pass::ForwardBlock || pass == Pass::BackwardBlock ? 100 : 257;
  c.block_sparse = block_sparse;
  for (const char* n : {"Q", "K", "V", "O", "dO", "dQ", "dK", "dV"}) c.views.push_back(view(n, d));
  return c;
}

std::string message_of(const Call& c, int cc, Variant v) {
  try {
    choose_variant(c, cc, v);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaVariantTable, NamesNumbersAndOrderAreConsistent) {
  const auto& t = variants();
  ASSERT_FALSE(t.empty());
  std::set<int> numbers;
  std::set<std::string> names;
  for (const VariantInfo& v : t) {
    SCOPED_TRACE(v.name);
    EXPECT_NE(v.id, Variant::Auto);
    EXPECT_EQ(std::string(v.name), "v" + std::to_string(static_cast<int>(v.id)));
    EXPECT_TRUE(numbers.insert(static_cast<int>(v.id)).second) << "number used twice";
    EXPECT_TRUE(names.insert(v.name).second) << "name used twice";
    EXPECT_EQ(parse_variant(v.name), v.id);
    EXPECT_EQ(parse_variant(std::to_string(static_cast<int>(v.id))), v.id);
    EXPECT_EQ(to_string(v.id), v.name);
    EXPECT_EQ(&variant_info(v.id), &v);
    EXPECT_FALSE(v.passes.empty());
    EXPECT_FALSE(v.dtypes.empty());
    EXPECT_GE(v.d_max, 1);
    for (int64_t d : v.d_values) EXPECT_TRUE(d >= 1 && d <= v.d_max) << d;
    EXPECT_TRUE(v.len_log2 >= 1 && v.len_log2 <= 63);
    EXPECT_EQ(v.cc != 0, std::string(v.arch) != "") << "a device rule names the code it runs";
    EXPECT_TRUE(std::string(v.files).find(".cu") != std::string::npos) << v.files;
  }
  // The last row is the fallback: every entry point, dtype and d of the layer, any device, any view.
  const VariantInfo& last = t.back();
  EXPECT_EQ(last.passes.size(), 4u);
  EXPECT_EQ(last.dtypes.size(), 4u);
  EXPECT_TRUE(last.d_values.empty());
  EXPECT_EQ(last.cc, 0);
  EXPECT_FALSE(last.aligned_views);
  EXPECT_FALSE(last.may_decline);
  EXPECT_EQ(last.len_log2, 63);
  EXPECT_TRUE(last.block_sparse_forward && last.deterministic_indexed_keys);
  for (const VariantInfo& v : t) EXPECT_LE(v.d_max, last.d_max) << v.name;
  // Number order for names and sweeps.
  const auto by_number = variants_by_number();
  ASSERT_EQ(by_number.size(), t.size());
  for (size_t i = 1; i < by_number.size(); ++i) EXPECT_LT(by_number[i - 1]->id, by_number[i]->id);
  std::string names_list = "auto";
  for (const VariantInfo* v : by_number) names_list += std::string(", ") + v->name;
  EXPECT_EQ(variant_names(), names_list);
  EXPECT_EQ(parse_variant("auto"), Variant::Auto);
  try {
    parse_variant("v9");
    ADD_FAILURE() << "expected burstlab::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("variant (v9)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(variant_info(Variant::Auto), Error);
}

// Today's variants, in preference order (the table may grow; these rows must stay as they are).
TEST(CudaVariantTable, TheRowsOfV1ToV4) {
  const auto& t = variants();
  std::vector<Variant> order;
  for (const VariantInfo& v : t)
    if (static_cast<int>(v.id) <= 4) order.push_back(v.id);
  EXPECT_EQ(order, (std::vector<Variant>{Variant::V4, Variant::V3, Variant::V2, Variant::V1}));
  EXPECT_FALSE(variant_info(Variant::V4).block_sparse_forward);
  EXPECT_FALSE(variant_info(Variant::V4).deterministic_indexed_keys);
  EXPECT_TRUE(variant_info(Variant::V4).may_decline);
  EXPECT_EQ(variant_info(Variant::V4).determinism, Determinism::OnRequest);
  EXPECT_EQ(variant_info(Variant::V3).cc, 90);
  EXPECT_EQ(variant_info(Variant::V2).cc, 0);
  std::string why;
  EXPECT_FALSE(runs_on(variant_info(Variant::V3), kAmpere, &why));
  EXPECT_NE(why.find("compute capability 9.0"), std::string::npos) << why;
  EXPECT_TRUE(runs_on(variant_info(Variant::V3), kHopper));
  EXPECT_TRUE(runs_on(variant_info(Variant::V2), kNoGpu));
}

// v14, v5 and v6: the whole backward only, never deterministic; v14 first in preference order
// (auto at d = 64), v6 and v5 after v4 (by name).
TEST(CudaVariantTable, TheRowsOfV14V5AndV6) {
  const VariantInfo& v14 = variant_info(Variant::V14);
  const VariantInfo& v5 = variant_info(Variant::V5);
  const VariantInfo& v6 = variant_info(Variant::V6);
  EXPECT_EQ(&variants()[0], &v14);
  EXPECT_EQ(&variants()[2], &v6);
  EXPECT_EQ(&variants()[3], &v5);
  EXPECT_EQ(v6.d_values, std::vector<int64_t>{64});
  EXPECT_EQ(v6.passes, std::vector<Pass>{Pass::Backward});
  EXPECT_EQ(v6.determinism, Determinism::Never);
  for (const VariantInfo* v : {&v14, &v5}) {
    EXPECT_EQ(v->passes, std::vector<Pass>{Pass::Backward});
    EXPECT_EQ(v->determinism, Determinism::Never);
    EXPECT_EQ(v->d_values, (std::vector<int64_t>{64, 128}));
    EXPECT_TRUE(v->may_decline);
    EXPECT_EQ(v->cc, 90);
  }
  EXPECT_EQ(v14.auto_d, std::vector<int64_t>{64});
  EXPECT_TRUE(v5.auto_d.empty());
  EXPECT_EQ(parse_variant("v5"), Variant::V5);
  EXPECT_EQ(parse_variant("5"), Variant::V5);
  EXPECT_EQ(parse_variant("v14"), Variant::V14);
}

TEST(CudaVariantDispatch, AutoOnRepresentativeCalls) {
  const Dtype bf = Dtype::BF16, h = Dtype::F16;
  // Forward: v4 on 9.0, v3 there for block-sparse masks; v2 elsewhere; v1 for the rest.
  for (Pass p : {Pass::Forward, Pass::ForwardBlock}) {
    SCOPED_TRACE(to_string(p));
    EXPECT_EQ(choose_variant(make_call(p, bf, 64), kHopper, Variant::Auto), Variant::V4);
    EXPECT_EQ(choose_variant(make_call(p, h, 128), kHopper, Variant::Auto), Variant::V4);
    EXPECT_EQ(choose_variant(make_call(p, bf, 64, true), kHopper, Variant::Auto), Variant::V3);
    EXPECT_EQ(choose_variant(make_call(p, bf, 64), kAmpere, Variant::Auto), Variant::V2);
    EXPECT_EQ(choose_variant(make_call(p, bf, 64, true), kAmpere, Variant::Auto), Variant::V2);
    EXPECT_EQ(choose_variant(make_call(p, Dtype::F32, 64), kHopper, Variant::Auto), Variant::V1);
    EXPECT_EQ(choose_variant(make_call(p, Dtype::F64, 128), kHopper, Variant::Auto), Variant::V1);
    std::string why;
    EXPECT_EQ(choose_variant(make_call(p, bf, 3), kHopper, Variant::Auto, &why), Variant::V1);
    EXPECT_NE(why.find("d in {64, 128}"), std::string::npos) << why;
    Call mis = make_call(p, bf, 64);
    mis.views[2] = view("V", 64, 1032);  // 8-byte aligned
    EXPECT_EQ(choose_variant(mis, kHopper, Variant::Auto, &why), Variant::V1);
    EXPECT_NE(why.find("16-byte aligned data (V)"), std::string::npos) << why;
    Call strided = make_call(p, bf, 64);
    strided.views[0] = view("Q", 64, 1024, 2);
    EXPECT_EQ(choose_variant(strided, kHopper, Variant::Auto), Variant::V1);
    Call odd = make_call(p, bf, 64);
    odd.views[1].stride[2] = 68;
    EXPECT_EQ(choose_variant(odd, kHopper, Variant::Auto), Variant::V1);
    Call longer = make_call(p, bf, 64);
    longer.N_k = int64_t(1) << 31;
    EXPECT_EQ(choose_variant(longer, kHopper, Variant::Auto, &why), Variant::V1);
    EXPECT_NE(why.find("< 2^31"), std::string::npos) << why;
    Call idx = make_call(p, bf, 64);
    idx.q_indexed = idx.k_indexed = true;
    EXPECT_EQ(choose_variant(idx, kHopper, Variant::Auto), Variant::V4);
    std::string none;
    EXPECT_EQ(choose_variant(make_call(p, bf, 64), kHopper, Variant::Auto, &none), Variant::V4);
    EXPECT_EQ(none, "");
  }
  // Backward: v14 at d = 64 on 9.0 (block masks included), v4 there at d = 128 and when
  // deterministic, else v2, else v1; v3, v5 and v6 only by name (or after v4 declines).
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 64), kHopper, Variant::Auto), Variant::V14);
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, h, 64, true), kHopper, Variant::Auto), Variant::V14);
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 64), kHopper, Variant::V5), Variant::V5);
  {  // d = 128: v4 (v14 and v5 by name only)
    std::string why;
    EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 128), kHopper, Variant::Auto, &why), Variant::V4);
    EXPECT_NE(why.find("v14 is auto's choice at d in {64} only"), std::string::npos) << why;
    EXPECT_EQ(choose_variant(make_call(Pass::Backward, h, 128, true), kHopper, Variant::Auto), Variant::V4);
    EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 128), kHopper, Variant::V5), Variant::V5);
    EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 128), kHopper, Variant::V14), Variant::V14);
  }
  {
    Call det = make_call(Pass::Backward, bf, 128);
    det.deterministic = true;
    std::string why;
    EXPECT_EQ(choose_variant(det, kHopper, Variant::Auto, &why), Variant::V4);
    EXPECT_NE(why.find("v14 has no deterministic mode"), std::string::npos) << why;
  }
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 64), kAmpere, Variant::Auto), Variant::V2);
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 64), kNoGpu, Variant::Auto), Variant::V2);
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, Dtype::F32, 64), kHopper, Variant::Auto), Variant::V1);
  // backward_block: v4 on 9.0, else v1 (v2, v3 have none); indexed keys in the deterministic mode: v1.
  Call bb = make_call(Pass::BackwardBlock, bf, 64);
  EXPECT_EQ(choose_variant(bb, kHopper, Variant::Auto), Variant::V4);
  EXPECT_EQ(choose_variant(bb, kAmpere, Variant::Auto), Variant::V1);
  bb.block_sparse = true;
  EXPECT_EQ(choose_variant(bb, kHopper, Variant::Auto), Variant::V4);
  bb.k_indexed = true;
  EXPECT_EQ(choose_variant(bb, kHopper, Variant::Auto), Variant::V4);  // the one-pass mode
  bb.deterministic = true;
  std::string why;
  EXPECT_EQ(choose_variant(bb, kHopper, Variant::Auto, &why), Variant::V1);
  EXPECT_NE(why.find("contiguous key positions"), std::string::npos) << why;
  bb.k_indexed = false;
  bb.q_indexed = true;
  EXPECT_EQ(choose_variant(bb, kHopper, Variant::Auto), Variant::V4);
  EXPECT_EQ(choose_variant(make_call(Pass::BackwardBlock, Dtype::F32, 64), kHopper, Variant::Auto), Variant::V1);
}

TEST(CudaVariantDispatch, ExplicitVariantsRunOrThrowNamingThemselves) {
  const Dtype bf = Dtype::BF16;
  EXPECT_EQ(choose_variant(make_call(Pass::Forward, bf, 64), kHopper, Variant::V2), Variant::V2);
  EXPECT_EQ(choose_variant(make_call(Pass::Forward, bf, 64), kHopper, Variant::V3), Variant::V3);
  EXPECT_EQ(choose_variant(make_call(Pass::Backward, bf, 64), kHopper, Variant::V3), Variant::V3);
  for (Pass p : {Pass::Forward, Pass::ForwardBlock, Pass::Backward, Pass::BackwardBlock})
    for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16})
      for (int cc : {kNoGpu, kAmpere, kHopper})
        EXPECT_EQ(choose_variant(make_call(p, t, 3, true), cc, Variant::V1), Variant::V1);
  const auto expect_throw = [](const Call& c, int cc, Variant v, const std::string& a, const std::string& b) {
    const std::string m = message_of(c, cc, v);
    EXPECT_NE(m.find(a), std::string::npos) << "'" << m << "' lacks '" << a << "'";
    EXPECT_NE(m.find(b), std::string::npos) << "'" << m << "' lacks '" << b << "'";
  };
  expect_throw(make_call(Pass::Forward, Dtype::F32, 64), kHopper, Variant::V2, "variant (v2) cannot run this forward",
               "bf16/fp16 only");
  expect_throw(make_call(Pass::Forward, bf, 64, true), kHopper, Variant::V4, "variant (v4)", "block-sparse");
  expect_throw(make_call(Pass::ForwardBlock, bf, 64, true), kHopper, Variant::V4, "variant (v4)", "block-sparse");
  expect_throw(make_call(Pass::Forward, bf, 64), kAmpere, Variant::V3, "variant (v3)", "compute capability 9.0");
  expect_throw(make_call(Pass::Backward, bf, 64), kAmpere, Variant::V4, "variant (v4) cannot run this backward",
               "compute capability 9.0");
  expect_throw(make_call(Pass::Backward, bf, 100), kHopper, Variant::V2, "variant (v2)", "d in {64, 128}");
  expect_throw(make_call(Pass::BackwardBlock, bf, 64), kHopper, Variant::V2, "variant (v2)", "has no backward_block");
  expect_throw(make_call(Pass::BackwardBlock, bf, 64), kHopper, Variant::V3, "variant (v3)", "has no backward_block");
  Call bb = make_call(Pass::BackwardBlock, bf, 64);
  bb.k_indexed = bb.deterministic = true;
  expect_throw(bb, kHopper, Variant::V4, "variant (v4) cannot run this backward_block", "contiguous key positions");
  Call det = make_call(Pass::Backward, bf, 64);
  det.deterministic = true;
  expect_throw(det, kHopper, Variant::V5, "variant (v5) cannot run this backward", "no deterministic mode");
  expect_throw(make_call(Pass::Forward, bf, 64), kHopper, Variant::V5, "variant (v5) cannot run this forward",
               "has no forward");
  expect_throw(make_call(Pass::BackwardBlock, bf, 64), kHopper, Variant::V5, "variant (v5)", "has no backward_block");
  expect_throw(make_call(Pass::Backward, bf, 128), kHopper, Variant::V6, "variant (v6) cannot run this backward",
               "d in {64}");
}

TEST(CudaVariantDispatch, LaunchOrderFallsBackAlongTheTable) {
  const Dtype bf = Dtype::BF16;
  using VV = std::vector<Variant>;
  EXPECT_EQ(launch_order(make_call(Pass::Forward, bf, 64), kHopper, Variant::Auto),
            (VV{Variant::V4, Variant::V3, Variant::V2, Variant::V1}));  // v4 declining runs v3
  EXPECT_EQ(launch_order(make_call(Pass::Forward, bf, 64, true), kHopper, Variant::Auto),
            (VV{Variant::V3, Variant::V2, Variant::V1}));
  EXPECT_EQ(launch_order(make_call(Pass::Backward, bf, 64), kHopper, Variant::Auto),
            (VV{Variant::V14, Variant::V4, Variant::V6, Variant::V5, Variant::V3, Variant::V2,
                Variant::V1}));  // v14 declining runs v4
  EXPECT_EQ(launch_order(make_call(Pass::Backward, bf, 128), kHopper, Variant::Auto),
            (VV{Variant::V4, Variant::V5, Variant::V3, Variant::V2, Variant::V1}));
  EXPECT_EQ(launch_order(make_call(Pass::BackwardBlock, bf, 64), kHopper, Variant::Auto),
            (VV{Variant::V4, Variant::V1}));  // v4 declining runs v1
  EXPECT_EQ(launch_order(make_call(Pass::Forward, bf, 64), kAmpere, Variant::Auto), (VV{Variant::V2, Variant::V1}));
  EXPECT_EQ(launch_order(make_call(Pass::Forward, bf, 64), kHopper, Variant::V4), (VV{Variant::V4}));
  EXPECT_THROW(launch_order(make_call(Pass::Forward, bf, 64), kAmpere, Variant::V4), Error);
  EXPECT_EQ(launch_order(make_call(Pass::Forward, Dtype::F32, 64), kHopper, Variant::Auto), (VV{Variant::V1}));
}

// The dispatch rules written out by hand, one branch per entry point (v14 for the backward at
// d = 64).
Variant rules_by_hand(const Call& c, int cc) {
  const bool tc = c.dtype == Dtype::BF16 || c.dtype == Dtype::F16;
  const int64_t lim = int64_t(1) << 31;
  bool views = c.d == 64 || c.d == 128;
  for (const ViewDesc& v : c.views) views = views && aligned_view_rule(v.data, v.stride) == nullptr;
  const bool ok = tc && c.N_q < lim && c.N_k < lim && views, hopper = cc == 90;
  switch (c.pass) {
    case Pass::Forward:
    case Pass::ForwardBlock:
      return ok && hopper && !c.block_sparse ? Variant::V4 : ok && hopper ? Variant::V3 : ok ? Variant::V2 : Variant::V1;
    case Pass::Backward:
      return ok && hopper ? (c.deterministic || c.d == 128 ? Variant::V4 : Variant::V14) : ok ? Variant::V2 : Variant::V1;
    case Pass::BackwardBlock:
      return ok && c.n_q < lim && c.n_k < lim && !(c.k_indexed && c.deterministic) && hopper ? Variant::V4
                                                                                             : Variant::V1;
  }
  return Variant::V1;
}

TEST(CudaVariantDispatch, AutoIsTheFirstSupportingRowAndMatchesTheRulesOnRandomCalls) {
  std::mt19937_64 rng(20261125);
  const Pass passes[] = {Pass::Forward, Pass::ForwardBlock, Pass::Backward, Pass::BackwardBlock};
  const Dtype dtypes[] = {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16};
  const int64_t ds[] = {1, 3, 64, 100, 128, 256, 1024};
  const int ccs[] = {kNoGpu, 75, kAmpere, 89, kHopper, 100};
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  for (int i = 0; i < 20000; ++i) {
    Call c = make_call(passes[pick(4)], dtypes[pick(4)], ds[pick(7)], pick(3) == 0);
    const int cc = ccs[pick(6)];
    c.q_indexed = pick(3) == 0;
    c.k_indexed = pick(3) == 0;
    c.deterministic = pick(2) == 0;
    if (pick(8) == 0) c.N_q = int64_t(1) << 31;
    if (pick(8) == 0) c.N_k = (int64_t(1) << 31) + 5;
    const int nv = pick(8);
    if (nv < 3) {  // one view breaks one rule
      ViewDesc& v = c.views[size_t(pick(int(c.views.size())))];
      if (nv == 0) v.data += 8;
      else if (nv == 1) v.stride[3] = 2;
      else v.stride[pick(3)] += 4;
    }
    const Variant got = choose_variant(c, cc, Variant::Auto);
    Variant first = Variant::Auto;
    for (const VariantInfo& v : variants())
      if (supports(v, c, cc) && (v.auto_d.empty() || std::find(v.auto_d.begin(), v.auto_d.end(), c.d) != v.auto_d.end())) {
        first = v.id;
        break;
      }
    ASSERT_EQ(got, first) << "call " << i;
    ASSERT_EQ(got, rules_by_hand(c, cc)) << "call " << i << ": " << to_string(c.pass) << " " << to_string(c.dtype)
                                         << " d " << c.d << " cc " << cc << " block " << c.block_sparse << " kidx "
                                         << c.k_indexed << " det " << c.deterministic;
    // An explicit request of the chosen row runs it; of a row that does not support the call, throws.
    for (const VariantInfo& v : variants()) {
      if (supports(v, c, cc)) {
        EXPECT_EQ(choose_variant(c, cc, v.id), v.id);
      } else {
        EXPECT_THROW(choose_variant(c, cc, v.id), Error);
      }
    }
  }
}

// cuda/README.md shows the table as capability_table() prints it.
TEST(CudaVariantTable, ReadmeHoldsTheTable) {
  std::ifstream f(std::string(BURSTLAB_SOURCE_DIR) + "/cuda/README.md");
  ASSERT_TRUE(f) << "cannot read cuda/README.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string table = capability_table();
  EXPECT_NE(ss.str().find(table), std::string::npos)
      << "cuda/README.md does not hold the variant table; replace its table with:\n" << table;
  for (const VariantInfo& v : variants())
    EXPECT_NE(table.find("| " + std::string(v.name) + " |"), std::string::npos) << v.name;
}

// ---------------------------------------------------------------- v4's tile order
TEST(CudaTileScheduler, EveryItemOnceLongestFirstTailByTurns) {
  for (int n_bh : {1, 2, 3, 7, 32})
    for (int nqt : {1, 2, 5, 16})
      for (int n_tail = 1; n_tail <= n_bh; n_tail = n_tail < 3 ? n_tail + 1 : n_tail * 2) {
        SCOPED_TRACE("n_bh " + std::to_string(n_bh) + " nqt " + std::to_string(nqt) + " tail " +
                     std::to_string(n_tail));
        const sched::TileOrder o = sched::tile_order(n_bh, nqt, n_tail);
        const int n = n_bh * nqt;
        std::vector<int> seen(size_t(n), 0);
        std::vector<int> last_qt(size_t(n_bh), nqt);  // each (b, h)'s tiles come longest (last) first
        for (int k = 0; k < n; ++k) {
          const sched::Tile t = sched::tile_of(o, k);
          ASSERT_TRUE(t.bh >= 0 && t.bh < n_bh && t.qt >= 0 && t.qt < nqt) << "item " << k;
          ++seen[size_t(t.bh * nqt + t.qt)];
          EXPECT_LT(t.qt, last_qt[size_t(t.bh)]) << "item " << k;
          last_qt[size_t(t.bh)] = t.qt;
          if (k < o.tail0) {
            EXPECT_EQ(t.bh, k / nqt) << "item " << k;  // (b, h) order before the tail
          } else {
            const int j = k - o.tail0;  // the tail: its (b, h) by turns, rank by rank
            EXPECT_EQ(t.bh, n_bh - n_tail + j % n_tail) << "item " << k;
            EXPECT_EQ(t.qt, nqt - 1 - j / n_tail) << "item " << k;
          }
        }
        for (int x = 0; x < n; ++x) EXPECT_EQ(seen[size_t(x)], 1) << "tile " << x;
      }
}

// The grid's hand-out (sched::fetch_item on the device): CTA c starts at item c; after each item
// it takes grid + the counter's old value, or stops when the grid covers every item. Whatever
// the order in which CTAs finish, every item runs exactly once and every CTA stops.
TEST(CudaTileScheduler, PersistentHandOutRunsEachItemOnce) {
  std::mt19937_64 rng(7);
  for (int64_t items : {1, 5, 64, 1000})
    for (int sms : {1, 3, 132})
      for (int knob : {0, -1, 2, 5}) {
        const int64_t grid = sched::grid_size(items, sms, 2, knob);
        ASSERT_GE(grid, 1);
        ASSERT_LE(grid, items);
        if (knob < 0) {
          EXPECT_EQ(grid, items);
        }
        if (knob > 0) {
          EXPECT_LE(grid, knob);
        }
        const int n = int(items), g = int(grid);
        std::vector<int> cur(static_cast<size_t>(g)), runs(static_cast<size_t>(n), 0);
        std::vector<int> live;
        for (int c = 0; c < g; ++c) {
          cur[size_t(c)] = c;
          live.push_back(c);
        }
        int counter = 0;
        while (!live.empty()) {
          const size_t li = size_t(rng() % live.size());
          const int c = live[li];
          if (cur[size_t(c)] >= n) {  // the CTA's loop ends
            live.erase(live.begin() + std::ptrdiff_t(li));
            continue;
          }
          ++runs[size_t(cur[size_t(c)])];
          cur[size_t(c)] = g >= n ? n : g + counter++;
        }
        for (int k = 0; k < n; ++k) ASSERT_EQ(runs[size_t(k)], 1) << "item " << k << " of " << n << ", grid " << g;
      }
}

TEST(CudaTileScheduler, TailSize) {
  EXPECT_EQ(sched::tail_size(132, 16, 64, 0), 17);  // ceil(2 x 132 / 16): about two waves
  EXPECT_EQ(sched::tail_size(132, 16, 8, 0), 8);    // at most every (b, h)
  EXPECT_EQ(sched::tail_size(132, 16, 64, 2), 2);
  EXPECT_EQ(sched::tail_size(132, 16, 64, -1), 1);  // the plain order
  for (int64_t grid : {1, 7, 132, 264})
    for (int64_t nqt : {1, 3, 16, 256})
      for (int64_t n_bh : {1, 2, 40})
        for (int knob : {-1, 0, 1, 3}) {
          const int64_t t = sched::tail_size(grid, nqt, n_bh, knob);
          EXPECT_TRUE(t >= 1 && t <= n_bh) << t;
        }
}

// ---------------------------------------------------------------- v4's forward shape
// The estimate over the benchmark grid's masks (row i of a causal N x N sees i + 1 keys), and the
// shape each row of docs/performance-gpu.md's tables ran.
TEST(CudaForwardShape, EachBenchmarkShapeTakesTheDocumentedShape) {
  using fwd_shape::Shape;
  const auto causal = [](int64_t n) { return fwd_shape::keys_per_row(n, [](int64_t r) { return r + 1; }); };
  const auto none = [](int64_t n) { return fwd_shape::keys_per_row(n, [n](int64_t) { return n; }); };
  EXPECT_DOUBLE_EQ(causal(1024), 512.03125);   // the true mean is 512.5
  EXPECT_DOUBLE_EQ(causal(2048), 1024.015625);  // 1024.5
  EXPECT_DOUBLE_EQ(causal(3072), 1536.015625);  // 1536.5
  EXPECT_DOUBLE_EQ(none(2048), 2048);
  EXPECT_DOUBLE_EQ(fwd_shape::keys_per_row(1, [](int64_t r) { return r + 5; }), 5);  // one row
  struct Case {
    int64_t d, n;
    bool is_causal;
    Shape shape;
  };
  for (const Case& c : {Case{64, 1024, false, Shape::FewKeys}, Case{64, 1024, true, Shape::FewKeys},
                        Case{64, 2048, true, Shape::FewKeys}, Case{64, 2048, false, Shape::Default},
                        Case{64, 3072, true, Shape::Default},  // estimate 1536.02
                        Case{64, 4096, true, Shape::Default}, Case{64, 16384, false, Shape::Default},
                        Case{128, 1024, true, Shape::Default},  // estimate 512.03, the limit 512
                        Case{128, 1024, false, Shape::Default}, Case{128, 4096, false, Shape::Default},
                        Case{128, 8192, true, Shape::ManyKeys},  // estimate 4096.02
                        Case{128, 8192, false, Shape::ManyKeys}, Case{128, 16384, true, Shape::ManyKeys}}) {
    const double keys = c.is_causal ? causal(c.n) : none(c.n);
    EXPECT_EQ(fwd_shape::choose(c.d, keys), c.shape)
        << "d " << c.d << " N " << c.n << (c.is_causal ? " causal" : " no mask") << ": estimate " << keys;
  }
  EXPECT_EQ(fwd_shape::choose(128, 512), Shape::FewKeys);
  EXPECT_EQ(fwd_shape::choose(64, 1344), Shape::FewKeys);
  EXPECT_EQ(fwd_shape::choose(64, 1344.5), Shape::Default);
  EXPECT_EQ(fwd_shape::choose(64, -1), Shape::Default);  // rows the host cannot see
  EXPECT_EQ(fwd_shape::choose(128, -1), Shape::Default);
}

}  // namespace
