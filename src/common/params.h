// Every ECCL_ environment variable is declared once, in params.cc's table.
// docs/env.md is checked against that table by a test (tests/params_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace eccl::params {

struct Param {
  const char* name;
  const char* type;  // "int" or "string"
  const char* defaultValue;
  const char* help;
};

const std::vector<Param>& all();

// Typed accessors; each reads the environment on every call so tests can
// change a variable between communicators.
int64_t timeoutMs();
int64_t heartbeatMs();
int64_t heartbeatTimeoutMs();
int64_t standbyTimeoutMs();
int64_t replaceWaitMs();
std::string envRole();
bool prepareEager();
int socketsPerPeer();
std::string socketIfname();
std::string debugLevel();
int64_t stripeMinBytes();
int64_t smallAllreduceBytes();
enum class SmallAllreduce { kAuto, kTree, kDoubling, kHalving };
SmallAllreduce smallAllreduceAlgorithm();
int64_t ringSegmentBytes();
int64_t handshakeTimeoutMs();
int64_t maxUnauthenticated();
int pinProgressThread();
int64_t copyHelpBytes();
bool shmUnlockedWrites();  // ECCL_SHM_UNLOCKED_WRITES  // ECCL_COPY_HELP_BYTES, resolved (0: never)
int64_t spinUs();
int64_t coordFailoverMs();
int64_t ibPollUs();
int64_t ibAnnounceReceives();
int64_t netPoolIdleMs();
int64_t netEagerBytes();
std::string ibHca();
int64_t ibGidIndex();
int64_t ibZeroCopyBytes();
int64_t shmDirectBytes();
int64_t shmPeerReads();
int64_t shmZeroCopyBytes();
int64_t shmFastPathBytes();
int64_t ibRegistrationCacheBytes();
int64_t netLogBytes();
int64_t snapshotReplicas();
int64_t snapshotInFlightBytes();
int64_t sandboxRecordBytes();
std::string netLogRanks();
std::string netLogWhenFull();
std::string transport();  // checked by transport::parseBackendList
int64_t shmRingBytes();
int64_t gpuChunkBytes();
std::string cudaDriverLibrary();
bool checkCalls();

// Launcher-provided identity (eccl-run); empty/negative when unset.
int envRank();
int envNranks();
std::string envUniqueId();
std::string hostId();  // ECCL_HOSTID: the failure domain; empty when unset

}  // namespace eccl::params
