#include "transport/peer_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace eccl::transport {

bool PeerMemory::read(uint64_t address, void* into, size_t bytes, std::string* why) const {
  size_t done = 0;
  while (done < bytes) {  // the kernel may stop at a page boundary
    iovec local{static_cast<char*>(into) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    ssize_t n = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const int error = errno;
      if (why)
        *why = fmt::format("process_vm_readv of {} bytes at {:#x} in process {}: {}", bytes - done, address + done,
                           pid_, n < 0 ? strerror(error) : "nothing read");
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace eccl::transport
