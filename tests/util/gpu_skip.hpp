// tests/util/gpu_skip.hpp — how a GPU test behaves on a machine without a usable GPU: it skips
// with a message, unless BURSTLAB_REQUIRE_GPU=1 (burstlab/env.hpp), where the skip becomes a
// failure, so that a GPU run cannot pass by skipping everything.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "burstlab/env.hpp"

namespace burstlab::testutil {

inline bool require_gpu_env() { return env::flag("BURSTLAB_REQUIRE_GPU"); }

}  // namespace burstlab::testutil

// `usable` is a callable bool(std::string* why): true when a GPU can run the test, else false
// with the reason in *why (e.g. burstlab::cuda::gpu_available). Returns from the test on a skip
// or failure, so it goes first in a TEST body.
#define BURSTLAB_REQUIRE_GPU(usable)                                                             \
  do {                                                                                           \
    std::string why_gpu_;                                                                        \
    if (!(usable)(&why_gpu_)) {                                                                  \
      if (::burstlab::testutil::require_gpu_env())                                               \
        FAIL() << "BURSTLAB_REQUIRE_GPU=1 but no usable GPU: " << why_gpu_;                      \
      GTEST_SKIP() << why_gpu_                                                                   \
                   << "; set BURSTLAB_REQUIRE_GPU=1 on a GPU machine to make this a failure";    \
    }                                                                                            \
  } while (0)
