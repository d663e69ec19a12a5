// burstlab/error.hpp — the one exception type of the contract (spec §1.4).
// Every host entry point validates its input and throws burstlab::Error with a message that
// names the field and the value, e.g. "H_q (6) must be a multiple of H_kv (4)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace burstlab {

struct Error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Builds a message from streamable parts: fail("d (", d, ") must be >= 1").
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(os.str());
}

}  // namespace burstlab
