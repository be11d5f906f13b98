// Reductions on device buffers: the same contract as the CPU reference in
// src/coll/reduce.h, bit for bit (integer sum and product wrap; float16 and
// bfloat16 widen to float32 for the arithmetic and round to nearest even,
// with the reference's NaN and subnormal handling; avg sums, and
// finishAverage divides once). `stream` is a cudaStream_t passed as void*;
// every call is asynchronous on it. Built when nvcc is present.
#pragma once

#include <cstddef>
#include <string>

#include "eccl.h"

namespace eccl::kernels::cuda {

// dst[i] = a[i] op b[i]; dst may alias a or b.
void reduce(void* dst, const void* a, const void* b, size_t count, ecclDataType_t type, ecclRedOp_t op, void* stream);
// buf[i] /= nranks, for every type but the half types (they average in float32).
void finishAverage(void* buf, size_t count, ecclDataType_t type, int nranks, void* stream);
// Between float16/bfloat16 and float32, as the reference converts.
void widenToFloat(const void* in, float* out, size_t count, ecclDataType_t halfType, void* stream);
void narrowFromFloat(const float* in, void* out, size_t count, ecclDataType_t halfType, void* stream);

// The first error of the work queued on `stream`, as std::runtime_error.
void synchronize(void* stream);

}  // namespace eccl::kernels::cuda
