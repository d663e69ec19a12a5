// burstlab/hd.hpp — host/device qualifier shared by every header of the contract.
#pragma once

#if defined(__CUDACC__)
#define BURSTLAB_HD __host__ __device__ __forceinline__
#else
#define BURSTLAB_HD inline
#endif
