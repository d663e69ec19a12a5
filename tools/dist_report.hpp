// tools/dist_report.hpp — what `run --algo` prints after its result table: the bytes each rank
// sent and received per phase against the closed forms of spec §7.5, and with --single the
// scaling table (one device vs G ranks).
#pragma once

#include <string>
#include <vector>

#include "algorithm.hpp"
#include "common.hpp"  // Result
#include "dist_flags.hpp"
#include "table.hpp"

namespace burstlab::tools {

// What one wrapped run leaves for the bytes table.
struct DistReport {
  std::string impl;
  Dtype dtype = Dtype::F64;
  dist::Plan plan;
  std::vector<std::vector<dist::Transfer>> logs;
  bool fwd = false, bwd = false;
  std::string transport = "SimComm";
  std::vector<std::vector<double>> exposed_fwd, exposed_bwd;  // nccl: [rank][step] ms blocked in waits
};

// Bytes per rank per phase, measured by the transport, next to the closed forms of spec §7.5,
// with each rank's send rate over the pass and its exposed communication (NCCL); then, with
// --single, the scaling table. Adds both to `header`; prints them unless `json`. Returns false
// when any measured count differs from its closed form.
bool bytes_report(const std::vector<DistReport>& reports, const DistFlags& f, Json& header, bool json,
                  const std::vector<Result>& rs);

}  // namespace burstlab::tools
