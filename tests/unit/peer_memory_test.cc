// PeerMemory (transport/peer_memory.h) against a real second process: reads
// and writes land whole at every distance from the peer's address, the
// ones the kernel copies slowly (1-31 bytes past it modulo a page, taken
// through a bounce buffer) included, across the bounce's 256 KiB pieces.
#include "transport/peer_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/copy.h"

namespace eccl::transport {
namespace {

constexpr size_t kArenaBytes = 2 << 20;

uint8_t expected(size_t i, uint8_t salt) { return static_cast<uint8_t>((i * 40503u + salt) >> 5); }

// A child holding a copy of `arena` (fork), waiting until told to check
// what the parent wrote into it (exit 0: every byte as expected).
struct Child {
  pid_t pid = -1;
  int go[2] = {-1, -1};
  Child(const uint8_t* arena, size_t writeAt, size_t writeBytes, uint8_t salt) {
    EXPECT_EQ(pipe(go), 0);
    pid = fork();
    if (pid == 0) {
      char c;
      if (read(go[0], &c, 1) != 1) _exit(3);
      for (size_t i = 0; i < writeBytes; ++i)
        if (arena[writeAt + i] != expected(i, salt)) _exit(1);
      _exit(0);
    }
  }
  int finish() {
    char c = 'g';
    EXPECT_EQ(write(go[1], &c, 1), 1);
    int status = 0;
    waitpid(pid, &status, 0);
    close(go[0]), close(go[1]);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  }
};

TEST(PeerMemory, ReadsAndWritesLandWholeAtEveryDistanceFromThePeersAddress) {
  auto* arena = static_cast<uint8_t*>(std::aligned_alloc(4096, kArenaBytes));
  ASSERT_NE(arena, nullptr);
  std::vector<uint8_t> local(kArenaBytes + 8192);
  const uintptr_t localPage = (reinterpret_cast<uintptr_t>(local.data()) + 4095) & ~uintptr_t{4095};
  int slowDistances = 0;
  for (size_t bytes : {size_t{5000}, size_t{(256 << 10) + 777}, size_t{700001}})
    for (size_t apart : {size_t{0}, size_t{1}, size_t{16}, size_t{31}, size_t{32}, size_t{4080}}) {
      const auto salt = static_cast<uint8_t>(bytes + apart);
      const size_t peerAt = 48;  // the peer's buffer: 48 bytes into a page
      for (size_t i = 0; i < bytes; ++i) arena[peerAt + i] = expected(i, salt);
      // The write goes `apart` bytes past `into` too, modulo a page.
      const size_t writeAt = ((peerAt + bytes + 4096) & ~size_t{4095}) + ((peerAt + 2 * apart) & 4095);
      Child child(arena, writeAt, bytes, salt);
      ASSERT_GT(child.pid, 0);
      PeerMemory peer(child.pid);
      auto* into = reinterpret_cast<uint8_t*>(localPage + ((peerAt + apart) & 4095));
      std::fill(into, into + bytes + 1, 0);
      slowDistances += kernelCopyAliasesPages(reinterpret_cast<uint64_t>(into),
                                              reinterpret_cast<uint64_t>(arena + peerAt), bytes);
      std::string why;
      ASSERT_TRUE(peer.read(reinterpret_cast<uint64_t>(arena + peerAt), into, bytes, &why)) << why;
      for (size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(into[i], expected(i, salt)) << "read: byte " << i << " of " << bytes << ", " << apart << " apart";
      ASSERT_EQ(into[bytes], 0) << "read past the end";
      const uint64_t target = reinterpret_cast<uint64_t>(arena + writeAt);
      ASSERT_TRUE(peer.write(target, into, bytes, &why)) << why;
      EXPECT_EQ(child.finish(), 0) << "write: " << bytes << " bytes, " << apart << " apart";
    }
  EXPECT_GT(slowDistances, 0) << "no case took the bounce buffer";
  std::free(arena);
}

TEST(PeerMemory, AReadOfAnUnmappedAddressFailsNamingTheCallAndTheProcess) {
  Child child(nullptr, 0, 0, 0);
  ASSERT_GT(child.pid, 0);
  PeerMemory peer(child.pid);
  std::vector<uint8_t> local(8192 + 8192);
  auto* into = reinterpret_cast<uint8_t*>(((reinterpret_cast<uintptr_t>(local.data()) + 4095) & ~uintptr_t{4095}) + 16);
  std::string why;
  // Address 4096 is never mapped; 16 bytes apart, so through the bounce buffer.
  ASSERT_TRUE(kernelCopyAliasesPages(reinterpret_cast<uint64_t>(into), 4096, 8192));
  EXPECT_FALSE(peer.read(4096, into, 8192, &why));
  EXPECT_NE(why.find("process_vm_readv"), std::string::npos) << why;
  EXPECT_NE(why.find(std::to_string(child.pid)), std::string::npos) << why;
  EXPECT_EQ(child.finish(), 0);
}

}  // namespace
}  // namespace eccl::transport
