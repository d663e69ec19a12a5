// distributed/traces.hpp — the teaching traces of the algorithm table (`Algorithm::trace`,
// `burstlab schedule`), spec §7: per step or collective, what each rank holds, computes and
// sends, then its bytes next to the closed forms (a mismatch prints "NO" and gives ok = false).
// Each covers the phases asked for (fwd, bwd) of a plan made by make_plan.
#pragma once

#include "algorithm.hpp"

namespace burstlab::dist {

Trace ring_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd);         // ring, burst (§7.2, §7.5)
Trace double_ring_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd);  // §7.9
// Ulysses (uly, §7.7) or all-gather CP (§7.8).
Trace collective_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd, bool uly);
Trace distflash_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd);    // §7.12
// Attention2D-NO (§7.11) or, overlap, Attention2D-O (§7.13).
Trace attention2d_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd, bool overlap);
Trace usp_trace(const Plan& plan, ElemBytes w, bool fwd, bool bwd);          // §7.14

}  // namespace burstlab::dist
