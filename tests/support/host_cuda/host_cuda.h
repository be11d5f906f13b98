// A host emulation of the CUDA driver calls eccl's stream path makes
// (src/gpu/cuda_driver.h), loaded through ECCL_CUDA_DRIVER so that the
// stream path runs in the suite where there is no GPU. "Device memory" is
// host memory this library hands out and recognises; each stream is a
// thread that runs its commands in order (copies, host functions, waits on
// a 32-bit value, events, stream-ordered frees), so work enqueued on a
// stream really runs after the call returns, as on a GPU. The suite's
// tests on a real GPU are tests/cuda/.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What tests use besides the driver's own calls (all return 0 on success). */
void* hostCudaMalloc(size_t bytes);
void hostCudaFree(void* p);
void* hostCudaStreamCreate(void);
int hostCudaStreamSynchronize(void* stream);
void hostCudaStreamDestroy(void* stream);
/* Enqueues a copy between any two buffers (device or host) on the stream. */
int hostCudaMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);

#ifdef __cplusplus
}
#endif
