// The shared-memory lane as the device sees it (Conduit): bulk frames are
// admitted only while the ring holds little unread, and the reader's reads
// wake a writer that waits for that.
#include <gtest/gtest.h>

#include <poll.h>

#include <algorithm>
#include <future>
#include <vector>

#include "common/clock.h"
#include "transport/backend.h"
#include "transport/conduit.h"

namespace eccl::transport {
namespace {

std::unique_ptr<Backend> shmBackend(MemberId self) {
  for (const BackendSpec& spec : registeredBackends())
    if (std::string(spec.name) == "shm") {
      BackendOptions options;
      options.self = self;
      options.ringBytes = 1 << 20;
      return spec.create(options);
    }
  return nullptr;
}

bool readableWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

TEST(ShmConduit, BulkWaitsForTheRingToDrainAndTheReadsWakeItsWriter) {
  auto listener = shmBackend(1), dialer = shmBackend(2);
  ASSERT_TRUE(listener && dialer);
  const auto deadline = deadlineAfterMs(5000);
  Fd stream = dialer->dial(1, listener->address(), deadline, "test dial", nullptr);
  ASSERT_TRUE(stream);
  Fd accepted;
  while (!(accepted = listener->accept(nullptr)) && Clock::now() < deadline) readableWithin(listener->listenFd(), 10);
  ASSERT_TRUE(accepted);
  // The dialer waits for the acceptor's word that it mapped the segment.
  auto dialed = std::async(std::launch::async, [&] { return dialer->openDialed(std::move(stream), deadline, "test writer"); });
  auto reader = listener->openAccepted(std::move(accepted), deadline, "test reader");
  auto writer = dialed.get();

  EXPECT_TRUE(writer->roomForBulk()) << "an empty ring refuses bulk";
  EXPECT_FALSE(writer->armBulkWakeup()) << "an empty ring lets a bulk writer sleep";
  std::vector<uint8_t> bytes(192 << 10, 0x5a), sink(bytes.size());
  iovec iov{bytes.data(), bytes.size()};
  ASSERT_EQ(writer->write(&iov, 1), static_cast<ssize_t>(bytes.size()));
  EXPECT_FALSE(writer->roomForBulk()) << "192 KiB unread of a 1 MiB ring still admits bulk";
  EXPECT_TRUE(writer->armBulkWakeup());
  EXPECT_FALSE(readableWithin(writer->pollFd(), 50)) << "woken with nothing read";

  size_t read = 0;
  while (read < bytes.size() - (16 << 10)) {
    ssize_t n = reader->read(sink.data(), bytes.size() - (16 << 10) - read);
    ASSERT_GT(n, 0);
    read += static_cast<size_t>(n);
  }
  EXPECT_TRUE(readableWithin(writer->pollFd(), 5000)) << "the reader's reads did not wake the waiting writer";
  writer->onPollReady();
  EXPECT_TRUE(writer->roomForBulk()) << "16 KiB unread still refuses bulk";
  EXPECT_TRUE(std::all_of(sink.begin(), sink.begin() + static_cast<ptrdiff_t>(read), [](uint8_t b) { return b == 0x5a; }));
}

}  // namespace
}  // namespace eccl::transport
