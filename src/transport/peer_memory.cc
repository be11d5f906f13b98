#include "transport/peer_memory.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/copy.h"
#include "common/log.h"

namespace eccl::transport {

namespace {

// Both directions: the kernel may stop at a page boundary, so go on from
// where it stopped.
template <typename Call>
bool transfer(const char* name, pid_t pid, uint64_t address, char* local, size_t bytes, std::string* why,
              Call call) {
  size_t done = 0;
  while (done < bytes) {
    iovec mine{local + done, bytes - done};
    iovec theirs{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = call(pid, &mine, 1, &theirs, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const int error = errno;
      if (why)
        *why = fmt::format("{} of {} bytes at {:#x} in process {}: {}", name, bytes - done, address + done, pid,
                           n < 0 ? strerror(error) : "nothing moved");
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// A copy the kernel would make at a distance where it is slow goes
// through a buffer of this thread's whose page offset matches the peer's
// address, in pieces that stay in L2: the kernel's copy is then 0 bytes
// apart and the second copy (copyBytes) is a fast vector loop.
constexpr size_t kBouncePieceBytes = 256 << 10;

char* bounceMatching(uint64_t address) {
  thread_local std::unique_ptr<char[]> bounce;
  if (!bounce) bounce.reset(new char[kBouncePieceBytes + 4096]);
  const auto base = reinterpret_cast<uint64_t>(bounce.get());
  return bounce.get() + ((address - base) & 4095);
}

}  // namespace

bool PeerMemory::read(uint64_t address, void* into, size_t bytes, std::string* why) const {
  auto* local = static_cast<char*>(into);
  if (!kernelCopyAliasesPages(reinterpret_cast<uint64_t>(local), address, bytes))
    return transfer("process_vm_readv", pid_, address, local, bytes, why, process_vm_readv);
  char* bounce = bounceMatching(address);
  for (size_t done = 0; done < bytes; done += kBouncePieceBytes) {
    const size_t n = std::min(kBouncePieceBytes, bytes - done);
    if (!transfer("process_vm_readv", pid_, address + done, bounce, n, why, process_vm_readv)) return false;
    copyBytes(local + done, bounce, n);
  }
  return true;
}

bool PeerMemory::write(uint64_t address, const void* from, size_t bytes, std::string* why) const {
  auto* local = static_cast<char*>(const_cast<void*>(from));
  if (!kernelCopyAliasesPages(address, reinterpret_cast<uint64_t>(local), bytes))
    return transfer("process_vm_writev", pid_, address, local, bytes, why, process_vm_writev);
  char* bounce = bounceMatching(address);
  for (size_t done = 0; done < bytes; done += kBouncePieceBytes) {
    const size_t n = std::min(kBouncePieceBytes, bytes - done);
    copyBytes(bounce, local + done, n);
    if (!transfer("process_vm_writev", pid_, address + done, bounce, n, why, process_vm_writev)) return false;
  }
  return true;
}

}  // namespace eccl::transport
