// tools/case_need.cpp — the memory of the case subcommands (cmd_case.hpp): each is the peak over
// the steps of one case, from the tool's own copies and the reference layer's oracle and bounds
// (reference/reference_footprint.hpp); the cases of a suite run one after the other.
#include <algorithm>

#include "cmd_case.hpp"
#include "reference_footprint.hpp"
#include "resources.hpp"

namespace burstlab::tools {
namespace {

using Sizes = Elements;

// The fp64 outputs of one case: O, LSE (and dQ, dK, dV).
int64_t outputs_bytes(const Problem& p, bool backward) {
  const Sizes z(p);
  return bytes_mul(8, bytes_sum({z.Eq, z.Er, backward ? bytes_add(z.Eq, bytes_mul(2, z.Ek)) : 0}));
}
// read_npy (check/npy.cpp) holds a file's bytes next to the fp64 values it parses from them.
MemPart file_bytes(const Problem& p, int64_t elem_bytes, const std::string& what) {
  const Sizes z(p);
  return {"the bytes of one " + what + " .npy file while it is parsed", bytes_mul(elem_bytes, std::max(z.Eq, z.Ek))};
}
// read_case: the inputs (the last one parsed next to its file's bytes).
MemNeed reading_case(const Problem& p, Dtype dtype) {
  std::vector<MemPart> parts = inputs_footprint(p, Dtype::F64);
  parts.push_back(file_bytes(p, bytes_of(dtype), "input"));
  parts.push_back(small_allocations());
  return make_need("reading the case's inputs", parts);
}
// check_candidate (check/case.cpp): forward_bounds, then backward_bounds for the candidate's
// dtype, over `held`; the bounds are those of oracle_need, their workspaces too.
MemNeed bounds_need(const Problem& p, bool backward, int threads, const std::vector<MemPart>& held,
                    const std::string& step) {
  std::vector<MemPart> f = held;
  for (const MemPart& x : reference::forward_bounds_parts(p, threads)) f.push_back(x);
  MemNeed n = make_need(step + "'s §9 forward bounds", f);
  if (backward) {
    std::vector<MemPart> b = held;
    for (const MemPart& x : reference::backward_bounds_parts(p, threads)) b.push_back(x);
    n = peak_of(n, make_need(step + "'s §9 backward bounds", b));
  }
  return n;
}
// compute_expected: the oracle next to the inputs, then the Expected copies of its outputs while
// the Oracle (outputs and bounds) is still alive.
MemNeed computing_expected(const Problem& p, bool backward, int threads) {
  std::vector<MemPart> parts = inputs_footprint(p, Dtype::F64);
  const MemNeed o = oracle_need(p, backward, threads);
  parts.insert(parts.end(), o.parts.begin(), o.parts.end());
  MemNeed n = make_need(o.step, parts);
  std::vector<MemPart> copy = inputs_footprint(p, Dtype::F64);
  for (const MemPart& x : oracle_kept(p, backward)) copy.push_back(x);
  copy.push_back({"the expected outputs copied from the oracle's, fp64", outputs_bytes(p, backward)});
  copy.push_back(small_allocations());
  return peak_of(n, make_need("copying the fp64 oracle's outputs", copy));
}
}  // namespace

MemNeed oracle_case_need(const Problem& p, Dtype dtype, bool backward, int threads) {
  MemNeed n = peak_of(reading_case(p, dtype), computing_expected(p, backward, threads));
  // write_expected: format_npy makes one file's bytes next to the outputs.
  std::vector<MemPart> w = inputs_footprint(p, Dtype::F64);
  w.push_back({"the expected outputs in fp64", outputs_bytes(p, backward)});
  w.push_back(file_bytes(p, 8, "output"));
  w.push_back(small_allocations());
  return peak_of(n, make_need("writing the expected outputs", w));
}

MemNeed check_case_need(const Problem& p, Dtype dtype, bool backward, int threads) {
  // read_expected and read_candidate: fp64 values of both, a candidate file of up to 8 bytes an
  // element being parsed last.
  std::vector<MemPart> held = inputs_footprint(p, Dtype::F64);
  held.push_back({"the oracle's outputs read from expected/, fp64", outputs_bytes(p, backward)});
  held.push_back({"the candidate's outputs in fp64", outputs_bytes(p, backward)});
  std::vector<MemPart> reading = held;
  reading.push_back(file_bytes(p, 8, "output"));
  reading.push_back(small_allocations());
  return peak_of(peak_of(reading_case(p, dtype), make_need("reading expected/ and the candidate", reading)),
                 bounds_need(p, backward, threads, held, "the check"));
}

MemNeed conform_case_need(const Problem& p, Dtype dtype, bool backward, bool expected_on_disk,
                          const std::vector<ConformColumn>& columns, int threads) {
  MemNeed n = reading_case(p, dtype);
  std::vector<MemPart> base = inputs_footprint(p, Dtype::F64);
  if (expected_on_disk) {
    std::vector<MemPart> r = base;
    r.push_back({"the oracle's outputs read from expected/, fp64", outputs_bytes(p, backward)});
    r.push_back(file_bytes(p, 8, "output"));
    r.push_back(small_allocations());
    n = peak_of(n, make_need("reading expected/", r));
  } else {
    n = peak_of(n, computing_expected(p, backward, threads));
  }
  base.push_back({"the expected outputs in fp64", outputs_bytes(p, backward)});
  // A column's run, then the check of its outputs while the run (its buffers and fetched
  // outputs) is still alive: the bound counts the run's whole footprint during the check.
  for (const ConformColumn& c : columns) {
    std::vector<MemPart> run = base;
    if (c.footprint)
      for (MemPart x : c.footprint(p, dtype, ImplOptions{}, backward, threads)) {
        x.what = c.name + ": " + x.what;
        run.push_back(x);
      }
    n = peak_of(n, make_need("column " + c.name + " (" + to_string(dtype) + ")", run));
    run.push_back({c.name + ": its outputs in fp64 for the check", outputs_bytes(p, backward)});
    n = peak_of(n, bounds_need(p, backward, threads, run, "the check of column " + c.name));
  }
  return n;
}

std::string case_advice(const Problem& p, int threads, const MemAvailable& available,
                        const std::function<MemNeed(const Problem&, int)>& need, const std::string& other) {
  const int64_t budget = advice_budget(available);
  std::vector<std::string> ways;
  if (threads > 1 && need(p, 1).bytes <= budget) ways.push_back("--threads 1");
  if (!other.empty()) ways.push_back(other);
  const int64_t c = largest_fitting_length(p.N_q, p.N_k, [&](int64_t nq, int64_t nk) {
    Problem x = p;
    x.N_q = nq;  // the estimate reads the lengths; the mask arrays keep their (larger) size
    x.N_k = nk;
    return need(x, threads).bytes <= budget;
  });
  std::string s = fits_with(ways);
  if (c > 0)
    s += std::string(s.empty() ? "" : "; ") + "a case of this B, H_q, H_kv, d fits with N_q and N_k up to " +
         std::to_string(c);
  else
    s += std::string(s.empty() ? "" : "; ") + "not even a case of N_q = N_k = 1 fits: use fewer heads, a smaller batch or d";
  return s;
}

}  // namespace burstlab::tools
