// What a listen handle carries (NCCL moves its 128 bytes between ranks
// through its bootstrap): the listening process, the listen comm it names,
// a fresh random token that a connector must prove, and the process's
// address (every back end's part). Anything else in those bytes (garbage,
// another plugin's handle, a truncated address) is refused by decode().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/crypto.h"

namespace eccl::netplugin {

constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE

struct ListenHandle {
  uint64_t process = 0;   // the listener's member id on its device
  uint64_t listenId = 0;  // the job id its dials name
  Secret token{};
  std::string address;
};

// Throws ecclInvalidArgument when the address does not fit.
void encodeHandle(const ListenHandle& h, void* out);
// False, with the reason, for bytes that are not a handle of this plugin.
bool decodeHandle(const void* in, ListenHandle* h, std::string* why);

}  // namespace eccl::netplugin
