/* The NCCL net plugin's own calls (libnccl-net-eccl.so; under the preload
 * shim they are in the process already). Not part of NCCL's interface:
 * find them with dlsym(RTLD_DEFAULT, name), or link the plugin.
 *
 * The boundary-send log, as ecclLog* (eccl.h) with job ranks for peers:
 * under an eccl job, this process's sends through the plugin to the
 * configured job ranks (pipeline-stage neighbours) are copied into a
 * host-memory log, tagged, truncated at durable checkpoints and read
 * back. ECCL_NET_LOG_BYTES / ECCL_NET_LOG_RANKS / ECCL_NET_LOG_WHEN_FULL
 * configure it without code. */
#ifndef ECCL_NET_H_
#define ECCL_NET_H_

#include <stddef.h>
#include <stdint.h>

#include "eccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* config->peers: job ranks (NULL: every process of the job). */
ecclResult_t ecclNetLogConfigure(const ecclLogConfig_t* config);
ecclResult_t ecclNetLogSetTag(int64_t iteration, int32_t microbatch);
ecclResult_t ecclNetLogTruncate(int64_t iteration);
ecclResult_t ecclNetLogStats(ecclLogStats_t* stats);
ecclResult_t ecclNetLogRead(int rank, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes);

/* The preload shim's way in: watch a group (an NCCL communicator) through
 * the job's coordinator (1: watched, 0: no job), leave it, and ask whether
 * a member failed (1, with why). */
int ecclNetPluginWatchGroup(uint64_t uuid);
int ecclNetPluginLeaveGroup(uint64_t uuid);
int ecclNetPluginGroupFailure(uint64_t uuid, char* why, size_t whyBytes);

#ifdef __cplusplus
}
#endif

#endif /* ECCL_NET_H_ */
