#include "transport/peer_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

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

}  // namespace

bool PeerMemory::read(uint64_t address, void* into, size_t bytes, std::string* why) const {
  return transfer("process_vm_readv", pid_, address, static_cast<char*>(into), bytes, why, process_vm_readv);
}

bool PeerMemory::write(uint64_t address, const void* from, size_t bytes, std::string* why) const {
  return transfer("process_vm_writev", pid_, address, static_cast<char*>(const_cast<void*>(from)), bytes, why,
                  process_vm_writev);
}

}  // namespace eccl::transport
