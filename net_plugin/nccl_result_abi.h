/* NCCL's result codes, declared from its published nccl.h: shared by the
 * net plugin's tables (nccl_net_abi.h) and the preload shim's calls
 * (preload/nccl_api_abi.h). Plain C, as NCCL compiles against. */
#ifndef ECCL_NET_PLUGIN_NCCL_RESULT_ABI_H_
#define ECCL_NET_PLUGIN_NCCL_RESULT_ABI_H_

#ifdef __cplusplus
extern "C" {
#endif

/* NCCL's own result codes (nccl.h); the same values as eccl's first seven. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#ifdef __cplusplus
}
#endif

#endif /* ECCL_NET_PLUGIN_NCCL_RESULT_ABI_H_ */
