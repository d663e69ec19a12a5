// tools/memcount.hpp — heap accounting for `burstlab bench` (peak extra memory of a forward,
// to show that the tiled forward is O(N d): no N x N buffer). memcount.cpp interposes malloc,
// calloc, realloc, free and the aligned allocators of THIS executable (operator new and Eigen's
// allocations go through them) and counts live bytes by malloc_usable_size.
#pragma once

#include <cstdint>

namespace burstlab::tools {

int64_t heap_live();        // bytes allocated and not freed, now
int64_t heap_peak();        // highest heap_live() since the last heap_reset_peak()
void heap_reset_peak();     // peak := live
bool heap_counting();       // false when the interposition is not in effect (then report nothing)

}  // namespace burstlab::tools
