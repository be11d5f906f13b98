// Level 1: non-blocking point-to-point (ecclIsend/ecclIrecv/ecclTest/
// ecclWait). A receive kept pending does not block a collective issued
// after it; requests complete in any order; a failed one reports its error
// once settled; misuse is refused. A probe sees what arrived without
// taking it, and names the sender that came first (receive from any source).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

class Nonblocking : public ::testing::Test {
 protected:
  void SetUp() override { setenv("ECCL_SOCKET_IFNAME", "lo", 1); }
};

TEST_F(Nonblocking, APendingReceiveDoesNotBlockACollectiveIssuedAfterIt) {
  runThreads(2, [](int rank, ecclComm_t comm) {
    std::vector<float> in(1000, 0.0f), out(1000);
    ecclRequest_t request = nullptr;
    if (rank == 0) RANK_OK(ecclIrecv(in.data(), in.size(), ecclFloat32, 1, comm, &request), comm);
    // Rank 1 sends only after the allreduce: a blocking receive would deadlock here.
    float x = 1;
    RANK_OK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    RANK_CHECK(x == 2.0f, "allreduce");
    if (rank == 1) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(i);
      RANK_OK(ecclIsend(out.data(), out.size(), ecclFloat32, 0, comm, &request), comm);
    }
    int done = 0;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done) {
      RANK_OK(ecclTest(request, &done), comm);
      RANK_CHECK(std::chrono::steady_clock::now() < until, "the request never completed");
    }
    RANK_OK(ecclWait(request), comm);  // settled: returns its outcome again
    RANK_OK(ecclRequestFree(request), comm);
    if (rank == 0)
      for (size_t i = 0; i < in.size(); ++i) RANK_CHECK(in[i] == static_cast<float>(i), "element " + std::to_string(i));
  });
}

TEST_F(Nonblocking, RequestsCompleteInAnyOrderAndMatchInIssueOrder) {
  runThreads(2, [](int rank, ecclComm_t comm) {
    constexpr int k = 8;
    std::vector<std::vector<int32_t>> bufs(k, std::vector<int32_t>(257));
    std::vector<ecclRequest_t> reqs(k);
    for (int i = 0; i < k; ++i) {
      if (rank == 0) {
        std::fill(bufs[i].begin(), bufs[i].end(), i * 100);
        RANK_OK(ecclIsend(bufs[i].data(), bufs[i].size(), ecclInt32, 1, comm, &reqs[i]), comm);
      } else {
        RANK_OK(ecclIrecv(bufs[i].data(), bufs[i].size(), ecclInt32, 0, comm, &reqs[i]), comm);
      }
    }
    for (int i = k - 1; i >= 0; --i) {
      RANK_OK(ecclWait(reqs[i]), comm);
      RANK_OK(ecclRequestFree(reqs[i]), comm);
      if (rank == 1) RANK_CHECK(bufs[i][0] == i * 100 && bufs[i][256] == i * 100, "message " + std::to_string(i));
    }
  });
}

TEST_F(Nonblocking, MisuseIsRefusedAndAPendingRequestCannotBeFreed) {
  runThreads(2, [](int rank, ecclComm_t comm) {
    int32_t v = 0;
    ecclRequest_t request = nullptr;
    RANK_CHECK(ecclIsend(&v, 1, ecclInt32, rank, comm, &request) == ecclInvalidUsage, "send to self");
    RANK_CHECK(ecclIsend(&v, 1, ecclInt32, 5, comm, &request) == ecclInvalidArgument, "peer out of range");
    RANK_CHECK(ecclIsend(&v, 1, ecclInt32, 1 - rank, comm, nullptr) == ecclInvalidArgument, "null request");
    RANK_OK(ecclGroupStart(), comm);
    RANK_CHECK(ecclIrecv(&v, 1, ecclInt32, 1 - rank, comm, &request) == ecclInvalidUsage, "inside a group");
    RANK_OK(ecclGroupEnd(), comm);
    if (rank == 0) {
      RANK_OK(ecclIrecv(&v, 1, ecclInt32, 1, comm, &request), comm);
      RANK_CHECK(ecclRequestFree(request) == ecclInvalidUsage, "freed a pending receive");
    }
    float x = 0;
    RANK_OK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    if (rank == 1) RANK_OK(ecclSend(&rank, 1, ecclInt32, 0, comm, nullptr), comm);  // blocking and non-blocking match
    if (rank == 0) {
      RANK_OK(ecclWait(request), comm);
      RANK_CHECK(v == 1, "value");
      RANK_OK(ecclRequestFree(request), comm);
    }
  });
}

// Polls ecclIprobe until rank `from` (or any rank) has a message here.
void probeUntilArrived(ecclComm_t comm, int* peer, size_t* bytes) {
  const int asked = *peer;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int arrived = 0; !arrived;) {
    *peer = asked;
    RANK_OK(ecclIprobe(peer, &arrived, bytes, comm), comm);
    RANK_CHECK(std::chrono::steady_clock::now() < until, "nothing arrived from " + std::to_string(asked));
  }
}

TEST_F(Nonblocking, AProbeNamesTheFirstArrivalAndAReceiveFromItTakesIt) {
  runThreads(3, [](int rank, ecclComm_t comm) {
    float x = 0;
    std::vector<int32_t> mine(rank == 2 ? 100 : 50, rank);
    if (rank == 0) {
      int peer = ECCL_ANY_SOURCE, arrived = 1;
      size_t bytes = 1;
      RANK_OK(ecclIprobe(&peer, &arrived, &bytes, comm), comm);
      RANK_CHECK(arrived == 0 && bytes == 0 && peer == ECCL_ANY_SOURCE, "a message arrived before any was sent");
    }
    RANK_OK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    // Rank 2 sends first; rank 1 once rank 0 has seen rank 2's arrive.
    if (rank == 2) RANK_OK(ecclSend(mine.data(), mine.size(), ecclInt32, 0, comm, nullptr), comm);
    if (rank == 0) {
      int peer = 2;
      size_t bytes = 0;
      probeUntilArrived(comm, &peer, &bytes);
      RANK_CHECK(peer == 2 && bytes == 400, "probe of rank 2: " + std::to_string(bytes) + " bytes");
    }
    RANK_OK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    if (rank == 1) RANK_OK(ecclSend(mine.data(), mine.size(), ecclInt32, 0, comm, nullptr), comm);
    if (rank != 0) return;
    int peer = 1;
    size_t bytes = 0;
    probeUntilArrived(comm, &peer, &bytes);
    // Both are here: any source names the first, and probing takes nothing.
    auto firstArrival = [&](int expect, size_t expectBytes) {
      peer = ECCL_ANY_SOURCE;
      probeUntilArrived(comm, &peer, &bytes);
      RANK_CHECK(peer == expect && bytes == expectBytes,
                 "any source named rank " + std::to_string(peer) + " with " + std::to_string(bytes) + " bytes");
    };
    auto receive = [&] {
      std::vector<int32_t> got(bytes / sizeof(int32_t), -1);
      RANK_OK(ecclRecv(got.data(), got.size(), ecclInt32, peer, comm, nullptr), comm);
      for (int32_t v : got) RANK_CHECK(v == peer, "a value from rank " + std::to_string(peer));
    };
    firstArrival(2, 400);
    firstArrival(2, 400);
    receive();
    firstArrival(1, 200);
    receive();
    int arrived = 1;
    peer = ECCL_ANY_SOURCE;
    RANK_OK(ecclIprobe(&peer, &arrived, &bytes, comm), comm);
    RANK_CHECK(arrived == 0, "a message still there after both were received");
  });
}

TEST_F(Nonblocking, AProbeRefusesMisuse) {
  runThreads(2, [](int rank, ecclComm_t comm) {
    int peer = 1 - rank, arrived = 0;
    size_t bytes = 0;
    RANK_CHECK(ecclIprobe(nullptr, &arrived, &bytes, comm) == ecclInvalidArgument, "null peer");
    RANK_CHECK(ecclIprobe(&peer, nullptr, &bytes, comm) == ecclInvalidArgument, "null arrived");
    RANK_CHECK(ecclIprobe(&peer, &arrived, nullptr, comm) == ecclInvalidArgument, "null bytes");
    peer = rank;
    RANK_CHECK(ecclIprobe(&peer, &arrived, &bytes, comm) == ecclInvalidUsage, "probe of itself");
    peer = 5;
    RANK_CHECK(ecclIprobe(&peer, &arrived, &bytes, comm) == ecclInvalidArgument, "peer out of range");
    peer = ECCL_ANY_SOURCE;
    RANK_OK(ecclGroupStart(), comm);
    RANK_CHECK(ecclIprobe(&peer, &arrived, &bytes, comm) == ecclInvalidUsage, "inside a group");
    RANK_OK(ecclGroupEnd(), comm);
  });
}

}  // namespace
}  // namespace eccl::test
