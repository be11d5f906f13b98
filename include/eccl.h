/* eccl: elastic collective communication. Public C ABI (C99 and C++). */
#ifndef ECCL_H_
#define ECCL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ECCL_MAJOR 0
#define ECCL_MINOR 1
#define ECCL_PATCH 0
#define ECCL_VERSION_CODE (ECCL_MAJOR * 10000 + ECCL_MINOR * 100 + ECCL_PATCH)

/* Result codes, grouped by blast radius (see docs/errors.md). */
typedef enum {
  ecclSuccess = 0,
  /* Caller's fault; nothing changed, the communicator stays usable. */
  ecclInvalidArgument = 1,
  ecclInvalidUsage = 2,
  /* A peer or link failed; the communicator is revoked until recovered. */
  ecclRemoteError = 3,
  ecclTimeout = 4,
  ecclAuthError = 5,
  /* Local failure: the system or the library itself. */
  ecclSystemError = 6,
  ecclInternalError = 7,
  /* This member was declared failed and fenced: it can never rejoin the job. */
  ecclEvicted = 8,
  /* A logged send found the boundary-send log full (policy error, or block
   * past the deadline); nothing was sent or recorded. */
  ecclLogFull = 9,
  ecclNumResults = 10
} ecclResult_t;

typedef enum {
  ecclInt8 = 0, ecclUint8 = 1, ecclInt32 = 2, ecclUint32 = 3,
  ecclInt64 = 4, ecclUint64 = 5, ecclFloat16 = 6, ecclFloat32 = 7,
  ecclFloat64 = 8, ecclBfloat16 = 9,
  ecclNumTypes = 10,
  /* Never a valid type: keeps every int value representable, so a bad
     value from a caller is checked and rejected rather than undefined. */
  ecclDataTypeRangeMin = -0x7fffffff - 1, ecclDataTypeRangeMax = 0x7fffffff
} ecclDataType_t;

typedef enum {
  ecclSum = 0, ecclProd = 1, ecclMax = 2, ecclMin = 3, ecclAvg = 4,
  ecclNumOps = 5,
  ecclRedOpRangeMin = -0x7fffffff - 1, ecclRedOpRangeMax = 0x7fffffff /* never valid; see above */
} ecclRedOp_t;

#define ECCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[ECCL_UNIQUE_ID_BYTES]; } ecclUniqueId;

typedef struct ecclComm* ecclComm_t;
/* A cudaStream_t (or CUstream). Host buffers take NULL; device buffers take
 * the stream their work is ordered on (NULL: the legacy default stream). */
typedef void* ecclStream_t;

/* Config for ecclCommInitConfig. Set size = sizeof(ecclConfig_t); fields
 * past what the caller's size covers take their defaults, so new fields can
 * be appended without breaking the ABI. */
typedef struct {
  size_t size;
  int64_t timeoutMs;        /* 0: ECCL_TIMEOUT_MS */
  int socketsPerPeer;       /* 0: ECCL_NSOCKS_PERPEER */
} ecclConfig_t;

/* Versions and errors. */
ecclResult_t ecclGetVersion(int* version);
const char* ecclGetErrorString(ecclResult_t result);
/* The message of the last failed call on comm (or of this thread when comm
 * is NULL). Valid until the next call on the same comm/thread. */
const char* ecclGetLastError(ecclComm_t comm);

/* Communicator creation and teardown. */
ecclResult_t ecclGetUniqueId(ecclUniqueId* uniqueId);
ecclResult_t ecclCommInitRank(ecclComm_t* comm, int nranks, ecclUniqueId commId, int rank);
ecclResult_t ecclCommInitRankConfig(ecclComm_t* comm, int nranks, ecclUniqueId commId,
                                    int rank, const ecclConfig_t* config);
/* Reads ECCL_RANK, ECCL_NRANKS and ECCL_UNIQUE_ID (as set by eccl-run). */
ecclResult_t ecclCommInitFromEnv(ecclComm_t* comm);
/* Serialises a unique id as text (for environment variables) and back. */
ecclResult_t ecclUniqueIdToString(const ecclUniqueId* id, char* out, size_t outSize);
ecclResult_t ecclUniqueIdFromString(const char* text, ecclUniqueId* id);
ecclResult_t ecclCommDestroy(ecclComm_t comm);
ecclResult_t ecclCommAbort(ecclComm_t comm);
ecclResult_t ecclCommCount(const ecclComm_t comm, int* count);
ecclResult_t ecclCommUserRank(const ecclComm_t comm, int* rank);
/* The first error of work that failed outside a call (a peer's failure, a
 * stream-ordered op); when it is not ecclSuccess, ecclGetLastError(comm)
 * then says why. */
ecclResult_t ecclCommGetAsyncError(ecclComm_t comm, ecclResult_t* asyncError);

/* Elastic membership (docs/elastic.md). */
typedef enum {
  ecclRecoverReplace = 0,         /* a standby takes each failed rank; no renumbering */
  ecclRecoverShrink = 1,          /* failed ranks are dropped; survivors renumber densely */
  ecclRecoverReplaceOrShrink = 2, /* replace while standbys last, then shrink */
  ecclRecoverRangeMin = -0x7fffffff - 1, ecclRecoverRangeMax = 0x7fffffff /* never valid */
} ecclRecoverPolicy_t;

/* Registers this process as a standby of the job and waits (up to
 * ECCL_STANDBY_TIMEOUT_MS, or config->timeoutMs when set) until the
 * coordinator promotes it into a view; the communicator then has a rank. */
ecclResult_t ecclCommInitStandby(ecclComm_t* comm, ecclUniqueId commId, const ecclConfig_t* config);
/* After a revoke (an op returned ecclRemoteError or ecclTimeout): agrees on
 * the next view with every survivor and switches to it. Returns when the
 * new view is active; the handle stays valid. */
ecclResult_t ecclCommRecover(ecclComm_t comm, ecclRecoverPolicy_t policy);

/* Expected migration (the leaving rank is alive). Any member asks the
 * coordinator to move `rank` to a registered standby (ecclcoord migrate
 * --rank R does the same from outside). Returns at once: every member, the
 * leaver and the joiner open the connections the next view needs in the
 * background while collectives keep running on the current view. Asking
 * again for the same rank while it is prepared is a no-op. */
ecclResult_t ecclCommPrepare(ecclComm_t comm, int rank);
typedef enum {
  ecclPrepareNone = 0,      /* nothing is being prepared */
  ecclPreparePreparing = 1, /* the next view's connections are being opened */
  ecclPrepareReady = 2,     /* every member of the next view is prepared */
  ecclPrepareFailed = 3,    /* refused or aborted; ecclGetLastError says why; the current view stays */
  ecclPrepareStateRangeMax = 0x7fffffff
} ecclPrepareState_t;
/* leavingRank (may be NULL) receives the rank being migrated, -1 if none:
 * the leaver compares it with its own rank to know it should stream its
 * state; a joiner sees its own future rank. */
ecclResult_t ecclCommPrepareStatus(ecclComm_t comm, ecclPrepareState_t* state, int* leavingRank);
/* At a collective boundary, called by every member of the current view and
 * by the joiner: waits for the preparation, agrees with the coordinator that
 * every member of the next view is ready, swaps only the delta connections
 * and bumps the epoch. The joiner takes the leaver's rank; the leaver's
 * communicator is left (its ops return ecclInvalidUsage; destroy it). */
ecclResult_t ecclCommSwitchover(ecclComm_t comm);
/* The leaver-to-joiner channel of a migration being prepared: the leaver
 * streams its state while the others keep training. Blocking, in order. */
ecclResult_t ecclMigrationSend(const void* sendbuff, size_t count, ecclDataType_t datatype,
                               ecclComm_t comm, ecclStream_t stream);
ecclResult_t ecclMigrationRecv(void* recvbuff, size_t count, ecclDataType_t datatype,
                               ecclComm_t comm, ecclStream_t stream);
/* Collective over the current view: admits `count` registered standbys as
 * new ranks appended at the end. Returns when the new view is active. A
 * rank failing before every rank asked refuses it on every caller (recover
 * first). */
ecclResult_t ecclCommGrow(ecclComm_t comm, int count);

/* This member's identity in its job: unique, stable across views, never
 * reused (a failed member is never readmitted). Processes exchange it to
 * name each other in ecclCommReconfigure. */
ecclResult_t ecclCommMemberId(ecclComm_t comm, uint64_t* memberId);
/* Registers this process as a standby and returns at once: the handle has
 * a member id but no rank (collectives return ecclInvalidUsage) until a view
 * takes it in, through ecclCommAwaitPromotion or ecclCommReconfigure. */
ecclResult_t ecclCommRegisterStandby(ecclComm_t* comm, ecclUniqueId commId, const ecclConfig_t* config);
/* A standby from ecclCommRegisterStandby: waits up to timeoutMs (<= 0:
 * ECCL_STANDBY_TIMEOUT_MS) for a recovery, grow or migration to promote it.
 * ecclCommInitStandby is ecclCommRegisterStandby and this wait. */
ecclResult_t ecclCommAwaitPromotion(ecclComm_t comm, int64_t timeoutMs);
/* A standby runs the application's step before it has a rank: as rank
 * `rank` of `nranks`, every collective and send/receive on comm completes
 * locally at once, after the same argument checks, with outputs of the
 * right size: its own input where a one-rank group would return it
 * (allreduce, reduce and broadcast at their root, its own block of
 * allgather, reducescatter and alltoall), zeros where the data would come
 * from other ranks, and, for an eager standby (ECCL_PREPARE=eager), a
 * rank's recorded outputs of the same calls once one arrived
 * (ecclCommSandboxRecord). The sandbox's calls send nothing. ecclCommCount and
 * ecclCommUserRank say nranks and rank meanwhile. nranks = 0 leaves the
 * sandbox; a promotion (ecclCommAwaitPromotion, ecclCommReconfigure) ends
 * it and the same handle is a real rank. */
ecclResult_t ecclCommSandbox(ecclComm_t comm, int nranks, int rank);
/* A rank records the next `calls` collectives, sends and receives it makes
 * on comm (each call's signature and output; sends, calls past
 * ECCL_SANDBOX_RECORD_BYTES of outputs, and alltoallv, by signature only)
 * and, once the last of them completed, ships the recording, in the
 * background and below the collectives' priority, to every eager standby
 * (ECCL_PREPARE=eager) the job has. A standby in its sandbox answers the
 * same calls, in the recorded order, with these outputs where it would
 * otherwise give its own input or zeros: an allreduce's sum, a broadcast
 * from another rank, an allgather's other blocks; outputs that depend on
 * the rank (reducescatter, alltoall, reduce at the root, a receive) only in
 * a sandbox of the recording rank (a standby prefers its sandbox rank's
 * newest recording to other ranks' newer ones). Record one training step.
 * A failed call drops the recording; calls = 0 disarms. */
ecclResult_t ecclCommSandboxRecord(ecclComm_t comm, int calls);
/* Makes the view exactly `members` (member ids, in rank order), as a delta:
 * called by every process it names, with the same list and the same uuid
 * (never used before: each names one new epoch); returns when the new view
 * is active here. Members of the current view it leaves out leave the view
 * (dead or alive); standbys it names become ranks; connections between
 * members kept are inherited. Works on a revoked communicator (after a
 * failure) and forms the first view from standbys alone. Callers that
 * disagree about the list, a reused uuid, or a named member that is not an
 * idle standby or a live member of the view, get ecclInvalidUsage saying
 * which; a named member that dies meanwhile fails it for everyone with
 * ecclInvalidUsage naming it. timeoutMs <= 0: the communicator's timeout. */
ecclResult_t ecclCommReconfigure(ecclComm_t comm, const uint64_t* members, int count, uint64_t uuid,
                                 int64_t timeoutMs);
/* Ends the communicator for good from any thread, without freeing it: a
 * call blocked on it now, and every later one, returns ecclRemoteError.
 * Free it afterwards with ecclCommDestroy or ecclCommAbort, once no other
 * thread is inside a call on it. */
ecclResult_t ecclCommRevoke(ecclComm_t comm);

typedef struct {
  size_t size;                   /* set to sizeof(ecclCommStats_t) */
  uint32_t epoch;                /* the current view */
  uint32_t joinedEpoch;          /* the view this member joined in (1: original rank); the joiner
                                    of a migration being prepared holds epoch + 1 until it switches */
  int rank, nranks;
  uint64_t reconfigurations;     /* view changes this member went through */
  uint64_t openConnections;      /* lanes open now */
  uint64_t staleFramesDropped;
  /* The last reconfiguration: */
  uint64_t connectionsOpened;    /* while switching (ring neighbours) */
  uint64_t connectionsClosed;    /* to members that left */
  uint64_t connectionsInherited; /* open before and kept untouched */
  double agreeMs;                /* recover/switchover request until the new view arrived */
  double applyMs;                /* switching connections to the new view */
  double totalMs;
  uint64_t connectionsPrepared;  /* opened in the background before a switchover */
  double prepareMs;              /* announcement until this member was prepared */
  /* RDMA queue pairs (the ib transport; 0 over TCP and shared memory): */
  uint64_t queuePairsOpen;       /* open now in this process */
  uint64_t queuePairsOpened;     /* the last reconfiguration: created while switching */
  uint64_t queuePairsClosed;     /* destroyed while switching */
  uint64_t queuePairsPrepared;   /* created in the background before the switchover */
  /* The sandbox (ecclCommSandbox, ecclCommSandboxRecord): */
  uint64_t sandboxCalls;              /* calls a standby answered in its sandbox */
  uint64_t sandboxReplayed;           /* of those, answered with a member's recorded output */
  uint64_t sandboxRecordingsReceived; /* recordings a standby took in */
  uint64_t sandboxRecordingsShipped;  /* a rank's recordings sent whole, one per standby */
  /* Shared memory's fast path (ECCL_SHM_FAST_PATH_BYTES): collective messages sent and received
     through the slots beside a lane, and ones dropped there as an older view's or abandoned op's. */
  uint64_t fastMessagesSent;
  uint64_t fastMessagesReceived;
  uint64_t fastMessagesStale;
  /* Payload bytes copied into posted receives with the transport's lock released (TCP and shared-memory
     lanes), and of those, the bytes the progress thread copied from a peer's other lanes while a waiting
     caller copied one (ECCL_COPY_HELP_BYTES). */
  uint64_t bytesReadUnlocked;
  uint64_t bytesCopiedByHelper;
  /* Shared memory's large chunks written once into the peer (ECCL_SHM_ZERO_COPY_BYTES), with that lock
     released. */
  uint64_t zeroCopyBytesUnlocked;
  /* Shared memory, ECCL_SHM_DIRECT_BYTES: collectives (allreduce, reduce-scatter, all-gather,
     broadcast) that read their peers' buffers where they lie, the bytes this member read that way,
     and lanes whose peer's memory it may read. */
  uint64_t directCollectives;
  uint64_t peerBytesRead;
  uint64_t peerReadLanes;
  /* Lanes this member opened or accepted since it started, at any time (a view change's counts above
     cover only its own): a collective that had to open lanes shows here. */
  uint64_t connectionsOpenedEver;
  /* Messages that came whole before their receive was posted, copied out of the transport's staging
     into the receive with its lock released (from 8 KiB). */
  uint64_t stagedBytesCopiedUnlocked;
} ecclCommStats_t;
ecclResult_t ecclCommGetStats(ecclComm_t comm, ecclCommStats_t* stats);

/* Collectives, and ecclSend/ecclRecv below.
 * Host memory (stream NULL): blocking, they complete before returning.
 * CUDA device or managed memory: NCCL's stream semantics. The call enqueues
 * the op on `stream` and returns; it runs after the stream's earlier work,
 * and the stream's later work waits for it. Errors of enqueued work arrive
 * through ecclCommGetAsyncError. Every rank must issue stream ops and host
 * ops on a communicator in the same order (a call that is not
 * stream-ordered, on host buffers or changing membership or the logs,
 * first lets the communicator's pending stream ops run). Inside ecclGroupStart/End a
 * communicator's device calls run together at GroupEnd, ordered on every
 * stream they named; one group takes host or device buffers per
 * communicator, not both. Needs a CUDA driver at run time, not at build
 * time. */
ecclResult_t ecclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ecclDataType_t datatype, ecclRedOp_t op, ecclComm_t comm,
                           ecclStream_t stream);
ecclResult_t ecclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ecclDataType_t datatype, int root, ecclComm_t comm,
                           ecclStream_t stream);
ecclResult_t ecclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ecclDataType_t datatype, ecclRedOp_t op, int root, ecclComm_t comm,
                        ecclStream_t stream);
/* sendcount elements from each rank; recvbuff holds nranks * sendcount. */
ecclResult_t ecclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ecclDataType_t datatype, ecclComm_t comm, ecclStream_t stream);
/* sendbuff holds nranks * recvcount; each rank gets its recvcount block. */
ecclResult_t ecclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ecclDataType_t datatype, ecclRedOp_t op, ecclComm_t comm,
                               ecclStream_t stream);
/* count elements to and from each rank. */
ecclResult_t ecclAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          ecclDataType_t datatype, ecclComm_t comm, ecclStream_t stream);
/* Counts and displacements in elements, one per rank. */
ecclResult_t ecclAllToAllv(const void* sendbuff, const size_t sendcounts[],
                           const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                           const size_t rdispls[], ecclDataType_t datatype, ecclComm_t comm,
                           ecclStream_t stream);
ecclResult_t ecclSend(const void* sendbuff, size_t count, ecclDataType_t datatype, int peer,
                      ecclComm_t comm, ecclStream_t stream);
ecclResult_t ecclRecv(void* recvbuff, size_t count, ecclDataType_t datatype, int peer,
                      ecclComm_t comm, ecclStream_t stream);
ecclResult_t ecclBarrier(ecclComm_t comm);

/* Non-blocking point-to-point on host buffers: post and return at once;
 * sends and receives between two ranks are matched in issue order, like
 * ecclSend/ecclRecv (and with them). The buffer belongs to the request
 * until it completes. Not inside a group. Device memory is refused (use
 * ecclSend/ecclRecv with a stream). */
typedef struct ecclRequest* ecclRequest_t;
ecclResult_t ecclIsend(const void* sendbuff, size_t count, ecclDataType_t datatype, int peer, ecclComm_t comm,
                       ecclRequest_t* request);
ecclResult_t ecclIrecv(void* recvbuff, size_t count, ecclDataType_t datatype, int peer, ecclComm_t comm,
                       ecclRequest_t* request);
/* *done = 1 once the request has completed; the result is its outcome
 * (a failed request is done, with the error a blocking call would give). */
ecclResult_t ecclTest(ecclRequest_t request, int* done);
/* Blocks until the request completes, up to the communicator's timeout. */
ecclResult_t ecclWait(ecclRequest_t request);
/* Frees a completed request (a pending one: ecclInvalidUsage). */
ecclResult_t ecclRequestFree(ecclRequest_t request);
/* Whether the message the next receive from rank *peer (ecclRecv or
 * ecclIrecv) would take has begun to arrive, without taking it (MPI's
 * Iprobe): *arrived = 1 and *bytes its size, else *arrived = 0. With
 * *peer = ECCL_ANY_SOURCE, any other rank's: the message that arrived
 * first, and *peer is set to its sender. Never blocks. A receive from any
 * source is a probe, then a receive from the rank it named; a receive from
 * that rank posted in between takes that message first. Not inside a group
 * nor in the sandbox. */
#define ECCL_ANY_SOURCE (-1)
ecclResult_t ecclIprobe(int* peer, int* arrived, size_t* bytes, ecclComm_t comm);

/* Boundary-send logs: sends to chosen peers are teed into a host-memory log
 * (one arena allocated at configure time), tagged by iteration and
 * micro-batch, so a replacement for a failed peer can be fed again. */
typedef enum {
  ecclLogOnFullError = 0, /* the send fails with ecclLogFull; nothing is sent or recorded */
  ecclLogOnFullBlock = 1, /* wait for ecclLogTruncate, up to the timeout */
  ecclLogOnFullEvict = 2, /* drop the oldest records; replaying across the gap is an error */
  ecclLogOnFullRangeMax = 0x7fffffff
} ecclLogFullPolicy_t;
typedef struct {
  size_t size;                  /* set to sizeof(ecclLogConfig_t) */
  size_t capacityBytes;         /* the log's arena; 0 turns logging off */
  ecclLogFullPolicy_t whenFull; /* default (zeroed struct): error */
  const int* peers;             /* ranks whose sends are logged; NULL: every peer */
  int numPeers;
} ecclLogConfig_t;
ecclResult_t ecclLogConfigure(ecclComm_t comm, const ecclLogConfig_t* config);
/* The tag of the following sends. */
ecclResult_t ecclLogSetTag(ecclComm_t comm, int64_t iteration, int32_t microbatch);
/* Frees every record older than `iteration` (call when a checkpoint taken
 * at `iteration` is durable); time proportional to what it frees. */
ecclResult_t ecclLogTruncate(ecclComm_t comm, int64_t iteration);
/* Drops every record of `fromIteration` or later: after a failure in the
 * middle of an iteration that every rank then redoes, the first attempt's
 * records must never be replayed. */
ecclResult_t ecclLogDiscard(ecclComm_t comm, int64_t fromIteration);
typedef struct {
  size_t size;                  /* set to sizeof(ecclLogStats_t) */
  uint64_t records, bytes, capacityBytes;
  int64_t oldestIteration, newestIteration; /* -1 when empty */
  int32_t oldestMicrobatch, newestMicrobatch;
  uint64_t evictions;           /* records dropped by the evict policy */
  uint64_t gaps;                /* peers whose log has an evicted hole */
} ecclLogStats_t;
ecclResult_t ecclLogStats(ecclComm_t comm, ecclLogStats_t* stats);
/* Re-sends, in their original order, the logged records for `peer` with
 * iterations in [fromIteration, toIteration]: the peer receives them with
 * the ecclRecv calls it would have made, and verifies each one's CRC32C.
 * A truncated or evicted part of the range, or a peer that is not logged,
 * is an error (nothing is sent). */
ecclResult_t ecclLogReplay(ecclComm_t comm, int peer, int64_t fromIteration, int64_t toIteration);
typedef struct {
  size_t size;                  /* set to sizeof(ecclLogRecord_t) */
  uint32_t epoch;
  int peer;
  int64_t iteration;
  int32_t microbatch;
  uint64_t seq;                 /* per peer, in send order */
  ecclDataType_t datatype;
  size_t count;
  uint32_t crc32c;
} ecclLogRecord_t;
/* Record `index` among those logged for `peer` (oldest first); its payload
 * is copied to buffer when bufferBytes is large enough (buffer may be NULL). */
ecclResult_t ecclLogRead(ecclComm_t comm, int peer, size_t index, ecclLogRecord_t* record, void* buffer,
                         size_t bufferBytes);

/* Mixture-of-Experts dispatch with uneven expert replicas (collective).
 * x: numTokens rows of `hidden` elements; topkIds: numTokens x topk expert
 * ids (-1: no expert); replicas: numExperts x nranks replica counts, equal
 * on every rank (an expert may have several replicas on one rank). Each
 * expert's tokens are split over its replicas in quotas differing by at
 * most one, local replicas first, and exchanged without padding. The plan
 * holds the received rows, expert-major, until ecclMoeCombine.
 * Host buffers (stream NULL): blocking. Device buffers (x and topkIds; the
 * replicas table may be on either side): the dispatch is enqueued on
 * `stream` like a collective; ecclMoeExpertInput then waits until the
 * stream has reached it (how many rows arrive is known only then) and
 * returns rows in device memory, valid in the dispatch stream's order and
 * freed, in that order, by ecclMoePlanDestroy; ecclMoeCombine takes device
 * buffers and is stream-ordered. Not inside ecclGroupStart/End. */
typedef struct ecclMoePlan* ecclMoePlan_t;
ecclResult_t ecclMoeDispatch(const void* x, const int32_t* topkIds, int64_t numTokens, int topk,
                             int64_t hidden, ecclDataType_t datatype, const int32_t* replicas,
                             int numExperts, ecclMoePlan_t* plan, ecclComm_t comm,
                             ecclStream_t stream);
/* The rows this rank's experts process: local expert q (localExperts[q])
 * owns rows [expertOffsets[q], expertOffsets[q] + expertRows[q]) of `rows`.
 * The arrays live as long as the plan. */
ecclResult_t ecclMoeExpertInput(ecclMoePlan_t plan, void** rows, int* numLocalExperts,
                                const int32_t** localExperts, const int64_t** expertRows,
                                const int64_t** expertOffsets);
/* expertOutput: the experts' results in the same layout (may be the rows
 * of ecclMoeExpertInput); out[t] = sum_k weights[t][k] * result of choice
 * k, accumulated in float32 (float32, float16, bfloat16 data). weights
 * NULL: no sum; out is numTokens x topk rows, row t*topk+k the result of
 * token t's choice k (zeros for -1), any data type: what the backward of
 * the weights needs. */
ecclResult_t ecclMoeCombine(ecclMoePlan_t plan, const void* expertOutput, const float* weights,
                            void* out, ecclComm_t comm, ecclStream_t stream);
/* Rows routed along the plan's schedule, no counts exchanged (collective;
 * the backward of combine): rows is numTokens x hidden (perChoice 0: each
 * token's row goes to each of its choices, as x did) or numTokens x topk x
 * hidden (perChoice 1: choice k's own row), of the dispatch's type;
 * expertRows receives them in ecclMoeExpertInput's layout. Host or device
 * buffers, as the dispatch's. */
ecclResult_t ecclMoeDispatchAlong(ecclMoePlan_t plan, const void* rows, int perChoice, void* expertRows,
                                  ecclComm_t comm, ecclStream_t stream);
/* What the plan moves, in rows: sent to and received from other ranks, and
 * kept here (local first: routed to a replica on this rank, never sent). */
typedef struct {
  int64_t rowsSent, rowsReceived, rowsKept;
} ecclMoePlanStats_t;
ecclResult_t ecclMoePlanGetStats(ecclMoePlan_t plan, ecclMoePlanStats_t* stats);
ecclResult_t ecclMoePlanDestroy(ecclMoePlan_t plan);

/* Lazarus's planner (docs/moe.md "Placement"): host calls, no
 * communicator. A placement is a slot table of nodes x slotsPerNode expert
 * ids (-1: empty slot); a node may hold one expert more than once.
 * Replicas per expert from observed load: the total is nodes x
 * slotsPerNode, every expert gets at least minReplicas. */
ecclResult_t ecclMoeAllocateReplicas(const double* load, int numExperts, int nodes, int slotsPerNode,
                                     int minReplicas, int32_t* replicas);
typedef enum {
  ecclMoePlaceMaxOverlap = 0, /* groups of experts share runs of nodes: fewest ways to lose one */
  ecclMoePlaceSpread = 1,     /* round robin over nodes */
  ecclMoePlaceCompact = 2     /* fill node by node */
} ecclMoePlacePolicy_t;
ecclResult_t ecclMoePlace(const int32_t* replicas, int numExperts, int nodes, int slotsPerNode,
                          ecclMoePlacePolicy_t policy, int32_t* slots);
typedef struct {
  double probability; /* every expert keeps a replica after `failures` random node failures */
  double low, high;   /* 95% interval (equal to probability when exact) */
  int exact;          /* 1: every failure set enumerated; 0: seeded Monte-Carlo */
  uint64_t cases;
} ecclMoeRecovery_t;
ecclResult_t ecclMoeRecoveryProbability(const int32_t* slots, int nodes, int slotsPerNode, int numExperts,
                                        int failures, uint64_t seed, ecclMoeRecovery_t* out);
typedef struct {
  int expert, fromNode, toNode; /* physical nodes */
} ecclMoeTransfer_t;
/* From currentSlots (nodes x slotsPerNode; the failed nodes' slots are
 * ignored) to targetSlots ((nodes - numFailed) x slotsPerNode, plan node
 * by plan node): planToPhysical[p] is the surviving node that takes plan
 * node p (chosen to keep the most experts in place), and each expert
 * replica the target needs where it is not yet is copied from a surviving
 * owner, an expert's copies dealt round robin over its owners. An expert
 * with no surviving owner is ecclInvalidArgument naming it (restore it
 * from a snapshot). */
ecclResult_t ecclMoePlanMigration(const int32_t* currentSlots, int nodes, int slotsPerNode, int numExperts,
                                  const int* failed, int numFailed, const int32_t* targetSlots,
                                  int32_t* planToPhysical, ecclMoeTransfer_t* transfers, int maxTransfers,
                                  int* numTransfers);

/* Peer-memory snapshots (docs/snapshots.md): named buffers (host or device
 * memory) copied to host memory and replicated to `replicas` other ranks'
 * memory in the background, at a lower priority than collectives. A
 * version commits once every rank's shards for it reached their replicas;
 * a version may hold any subset of the names (sparse). */
#define ECCL_SNAPSHOT_NAME_BYTES 256 /* a name has 1 to 255 bytes */
typedef struct {
  size_t size;             /* set to sizeof(ecclSnapshotConfig_t) */
  int replicas;            /* copies of each rank's shards on other ranks; 0 with
                              replicasSet = 0: ECCL_SNAPSHOT_REPLICAS (default 1) */
  int replicasSet;         /* 1: `replicas` is meant even when 0 */
  size_t maxInFlightBytes; /* replication bytes posted at once; 0:
                              ECCL_SNAPSHOT_INFLIGHT_BYTES (default 8 MiB) */
} ecclSnapshotConfig_t;
/* Collective over the view (config NULL: the defaults); a replacement or a
 * rank the view grew by (both come as standbys) calls it once promoted,
 * before ecclSnapshotRestore.
 * Called again after the view shrank (a recovery with no standby), or
 * after ecclSnapshotRestore failed with shards in no memory (the caller
 * rebuilt its state another way, e.g. from data-parallel replicas) or on
 * a view that shrank (a recovery that replaced a rank and dropped another:
 * the replacement calls it again with the others), it
 * starts the snapshots over on the ranks: every copy, own and held,
 * is dropped (read a departed rank's shards with ecclSnapshotGetHeld
 * first) and nothing is committed until the next version. */
ecclResult_t ecclSnapshotConfigure(ecclComm_t comm, const ecclSnapshotConfig_t* config);
/* Copies `bytes` of buff into `version` (newer than any before it). A
 * version stays open for puts until this rank commits it. */
ecclResult_t ecclSnapshotPut(ecclComm_t comm, int64_t version, const char* name, const void* buff, size_t bytes);
/* This rank's puts for `version` are done (it may have put none):
 * replication starts; returns at once. */
ecclResult_t ecclSnapshotCommit(ecclComm_t comm, int64_t version);
/* Until `version` is committed (every rank's shards replicated), it failed
 * (the error says why) or timeoutMs passed (<= 0: the communicator's). */
ecclResult_t ecclSnapshotWait(ecclComm_t comm, int64_t version, int64_t timeoutMs);
/* The newest committed version, -1 if none. */
ecclResult_t ecclSnapshotCommitted(ecclComm_t comm, int64_t* version);
typedef struct {
  char name[ECCL_SNAPSHOT_NAME_BYTES];
  int64_t version; /* the version this name's committed copy comes from */
  size_t bytes;
} ecclSnapshotEntry_t;
/* This rank's dense view: each name's latest committed copy. *count gets
 * how many there are; at most `capacity` are written. */
ecclResult_t ecclSnapshotList(ecclComm_t comm, ecclSnapshotEntry_t* entries, int capacity, int* count);
/* Copies this rank's committed copy of `name` into buff (host or device
 * memory of exactly its size); *version (may be NULL) gets its version. */
ecclResult_t ecclSnapshotGet(ecclComm_t comm, const char* name, void* buff, size_t bytes, int64_t* version);
/* The replicas this rank holds of other ranks' shards, each name's latest
 * committed copy. `owner` is a rank of the view the snapshots were last
 * configured or restored in: after a shrink, until ecclSnapshotConfigure
 * starts them over, that is the view the departed ranks were in. */
typedef struct {
  int owner;
  char name[ECCL_SNAPSHOT_NAME_BYTES];
  int64_t version;
  size_t bytes;
} ecclSnapshotHeldEntry_t;
ecclResult_t ecclSnapshotListHeld(ecclComm_t comm, ecclSnapshotHeldEntry_t* entries, int capacity, int* count);
/* Copies the replica this rank holds of `owner`'s `name` into buff (host or
 * device memory of exactly its size). Local: it works after the view
 * changed, which is when a survivor takes over a departed rank's state. */
ecclResult_t ecclSnapshotGetHeld(ecclComm_t comm, int owner, const char* name, void* buff, size_t bytes,
                                 int64_t* version);
/* Collective over the view after it changed (ecclCommRecover, a
 * replacement promoted, a grow: the ranks it added start empty, the others
 * keep their numbers and copies): the ranks agree on the newest committed version
 * (*version), a replacement fetches its rank's shards from the survivors'
 * memory, and replication resumes. ecclRemoteError names the ranks whose
 * shards lost every replica (the rest is restored); ecclInvalidUsage on
 * every rank when the view shrank (snapshots follow rank numbers): start
 * over with ecclSnapshotConfigure. */
ecclResult_t ecclSnapshotRestore(ecclComm_t comm, int64_t* version);
/* What this rank's last ecclSnapshotRestore found, for a program that
 * branches on it (the error text is for people): a failed restore's
 * ecclRemoteError may also be a peer dying during it. */
typedef enum {
  ecclSnapshotRestoreOk = 0,          /* it succeeded, or none has run */
  ecclSnapshotRestoreShardsLost = 1,  /* ecclSnapshotLoad, or start over */
  ecclSnapshotRestoreViewShrank = 2   /* start over: ecclSnapshotConfigure */
} ecclSnapshotRestoreState_t;
ecclResult_t ecclSnapshotRestoreState(ecclComm_t comm, ecclSnapshotRestoreState_t* state);
/* Writes this rank's newest committed version under `directory` in the
 * background (files fsynced and renamed into place, the manifest last). */
ecclResult_t ecclSnapshotPersist(ecclComm_t comm, const char* directory);
/* Until the last persist finished; *version (may be NULL): what is on disk. */
ecclResult_t ecclSnapshotPersistWait(ecclComm_t comm, int64_t timeoutMs, int64_t* version);
/* Collective: reads the newest version every rank persisted under
 * `directory` and replicates it. On a new job's configured communicator,
 * or after ecclSnapshotRestore failed with shards in no memory: then every
 * rank drops the copies it holds and goes back to that version (the
 * directory must be one that a replacement's host reaches too). */
ecclResult_t ecclSnapshotLoad(ecclComm_t comm, const char* directory, int64_t* version);

/* Operations between GroupStart and GroupEnd are posted together at
 * GroupEnd and progress together (a ring of send/recv cannot deadlock). */
ecclResult_t ecclGroupStart(void);
ecclResult_t ecclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif /* ECCL_H_ */
