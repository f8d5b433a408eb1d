// dmuon/common/host_device.h — functions compiled for the host and, under nvcc, the device.
#pragma once

#if defined(__CUDACC__)
#define DMUON_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DMUON_HOST_DEVICE inline
#endif
