/* libeccl-preload.so over the real libnccl, without a GPU: run with
 * LD_PRELOAD=libeccl-preload.so. The calls it defines resolve to the
 * shim and forward to NCCL's own (pnccl*), those it leaves alone reach
 * NCCL directly, and making a communicator selects eccl's net plugin
 * unless the user chose another. Exit 0: all held; 1: one did not (says
 * which); 77: the shim is not preloaded (a setup error, not a skip). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "preload_nccl_test: %s: ", #cond);    \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      failures++;                                           \
    }                                                       \
  } while (0)

static const char* objectOf(void* fn) {
  Dl_info info;
  return fn && dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "(none)";
}

int main(int argc, char** argv) {
  const char* expectNet = argc > 1 ? argv[1] : "eccl";
  void* init = dlsym(RTLD_DEFAULT, "ncclCommInitRank");
  if (!strstr(objectOf(init), "libeccl-preload")) {
    fprintf(stderr, "preload_nccl_test: ncclCommInitRank resolves to %s, not the shim: run with LD_PRELOAD\n",
            objectOf(init));
    return 1;
  }
  EXPECT(strstr(objectOf(dlsym(RTLD_DEFAULT, "ncclGetVersion")), "libnccl") != NULL,
         "ncclGetVersion resolves to %s", objectOf(dlsym(RTLD_DEFAULT, "ncclGetVersion")));
  int version = 0;
  EXPECT(ncclGetVersion(&version) == ncclSuccess && version >= 22000, "version %d", version);
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  EXPECT(rc == ncclSuccess, "ncclGetUniqueId -> %d (%s)", rc, ncclGetLastError(NULL));

  /* Without a GPU NCCL refuses the communicator; the shim passes its answer on. */
  ncclComm_t comm = NULL;
  rc = ncclCommInitRank(&comm, 1, id, 0);
  EXPECT(rc != ncclSuccess && rc != ncclInProgress, "ncclCommInitRank without a GPU -> %d", rc);
  const char* net = getenv("NCCL_NET_PLUGIN");
  EXPECT(net && strcmp(net, expectNet) == 0, "NCCL_NET_PLUGIN=%s after ncclCommInitRank, expected %s",
         net ? net : "(unset)", expectNet);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  rc = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  EXPECT(rc != ncclSuccess && rc != ncclInProgress, "ncclCommInitRankConfig without a GPU -> %d", rc);

  /* Bad input reaches NCCL's own checks. */
  ncclResult_t async = ncclSuccess;
  rc = ncclCommGetAsyncError(NULL, &async);
  EXPECT(rc == ncclInvalidArgument, "ncclCommGetAsyncError(NULL) -> %d", rc);
  rc = ncclCommDestroy(NULL);
  EXPECT(rc == ncclSuccess || rc == ncclInvalidArgument, "ncclCommDestroy(NULL) -> %d", rc);
  rc = ncclCommSplit(NULL, 0, 0, &comm, NULL);
  EXPECT(rc != ncclSuccess && rc != ncclInProgress, "ncclCommSplit(NULL) -> %d", rc);
  if (failures) return 1;
  printf("preload_nccl_test: NCCL %d through libeccl-preload.so: forwarding and NCCL_NET_PLUGIN=%s hold\n", version,
         expectNet);
  return 0;
}
