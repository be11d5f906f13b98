/* The public header compiles as C99 and the whole path works from C. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eccl.h"

#define CHECK(call)                                                              \
  do {                                                                           \
    ecclResult_t r_ = (call);                                                    \
    if (r_ != ecclSuccess) {                                                     \
      fprintf(stderr, "%s: %s (%s)\n", #call, ecclGetErrorString(r_), ecclGetLastError(NULL)); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(void) {
  int version = 0, rank = -1, count = -1;
  ecclUniqueId id;
  ecclComm_t comm;
  char text[256];
  ecclUniqueId back;
  float in[5] = {1, 2, 3, 4, 5}, out[5];
  ecclConfig_t config;
  ecclResult_t async;
  CHECK(ecclGetVersion(&version));
  if (version != ECCL_VERSION_CODE) return 1;
  CHECK(ecclGetUniqueId(&id));
  CHECK(ecclUniqueIdToString(&id, text, sizeof(text)));
  CHECK(ecclUniqueIdFromString(text, &back));
  if (memcmp(&id, &back, sizeof(id)) != 0) return 1;
  memset(&config, 0, sizeof(config));
  config.size = sizeof(config);
  config.timeoutMs = 5000;
  CHECK(ecclCommInitRankConfig(&comm, 1, id, 0, &config));
  CHECK(ecclCommUserRank(comm, &rank));
  CHECK(ecclCommCount(comm, &count));
  if (rank != 0 || count != 1) return 1;
  CHECK(ecclAllReduce(in, out, 5, ecclFloat32, ecclSum, comm, NULL));
  if (out[4] != 5.0f) return 1;
  if (ecclAllReduce(in, out, 5, ecclFloat32, ecclSum, comm, (ecclStream_t)in) != ecclInvalidArgument) return 1;
  if (strstr(ecclGetLastError(comm), "stream") == NULL) return 1;
  CHECK(ecclCommGetAsyncError(comm, &async));
  if (async != ecclSuccess) return 1;
  /* The reconfiguration calls from C: nothing prepared, no standby. */
  {
    ecclPrepareState_t state = ecclPrepareReady;
    int leaving = 7;
    ecclCommStats_t stats;
    CHECK(ecclCommPrepareStatus(comm, &state, &leaving));
    if (state != ecclPrepareNone || leaving != -1) return 1;
    if (ecclCommPrepareStatus(comm, NULL, NULL) != ecclInvalidArgument) return 1;
    if (ecclCommSwitchover(comm) != ecclInvalidUsage) return 1;
    if (strstr(ecclGetLastError(comm), "no reconfiguration") == NULL) return 1;
    if (ecclCommPrepare(comm, 3) != ecclInvalidArgument) return 1;
    if (ecclCommGrow(comm, 0) != ecclInvalidArgument) return 1;
    if (ecclMigrationSend(in, 5, ecclFloat32, comm, NULL) != ecclInvalidUsage) return 1;
    memset(&stats, 0, sizeof(stats));
    stats.size = sizeof(stats);
    CHECK(ecclCommGetStats(comm, &stats));
    if (stats.epoch != 1 || stats.nranks != 1 || stats.connectionsPrepared != 0) return 1;
  }
  CHECK(ecclCommDestroy(comm));
  printf("c api ok\n");
  return 0;
}
