// tests/check/fuzz_npy.cpp — libFuzzer entry for the .npy and case.json readers (clang,
// -DBURSTLAB_FUZZ=ON). Any exception other than burstlab::Error, or a crash, is a finding.
#include <cstdint>
#include <string>

#include "burstlab/error.hpp"
#include "case.hpp"
#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try { burstlab::check::parse_npy(bytes, "fuzz.npy"); } catch (const burstlab::Error&) {}
  try { burstlab::check::parse_case_json(bytes, "fuzz.json"); } catch (const burstlab::Error&) {}
  try { burstlab::check::parse_candidate_json(bytes, "fuzz.json"); } catch (const burstlab::Error&) {}
  return 0;
}
