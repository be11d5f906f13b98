// The CUDA kernels of the MoE dispatcher: the same contracts as the CPU
// reference (moe_schedule.h, moe_permute.h), on device pointers. Built
// with nvcc when a CUDA compiler is present (ECCL_HAVE_CUDA). `stream` is a
// cudaStream_t passed as void* so callers need no CUDA headers; every call
// is asynchronous on it, and synchronize() reports the first kernel error
// as std::runtime_error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "eccl.h"

namespace eccl::moe::cuda {

// True if a CUDA device can be used; otherwise `why` says why not.
bool available(std::string* why);

// send[e * N + j] and recv[e * N + j] (recv rows of experts not hosted by
// `rank` are zero): computeSchedule's answer, one thread per expert.
void schedule(int nranks, int nexperts, const int64_t* tokens, const int32_t* replicas, int rank, int64_t* send,
              int64_t* recv, void* stream);

// rowOf[t * k + s] as planPermute computes it, from the device schedule
// row of this rank. chunkBase is scratch of nexperts * nranks int64.
void planPermute(const int32_t* topk, int64_t tokens, int k, int nranks, int nexperts, const int64_t* send,
                 int64_t* chunkBase, int64_t* rowOf, void* stream);

void permuteRows(const void* x, size_t rowBytes, int64_t tokens, int k, const int64_t* rowOf, void* sendBuffer,
                 void* stream);
// expertMajor[regroupTo[r]] = received[r] (and the inverse).
void regroupRows(const void* received, size_t rowBytes, int64_t rows, const int64_t* regroupTo, void* expertMajor,
                 void* stream);
void ungroupRows(const void* expertMajor, size_t rowBytes, int64_t rows, const int64_t* regroupTo, void* received,
                 void* stream);

// out[t] = sum_s w[t,s] * y[rowOf[t,s]] in float32 (rounded products and
// sums, slot order), rounded once to float32/float16/bfloat16.
void combineRows(const void* y, const float* weights, int64_t tokens, int k, int64_t hidden, ecclDataType_t type,
                 const int64_t* rowOf, void* out, void* stream);

void synchronize(void* stream);

}  // namespace eccl::moe::cuda
