// libFuzzer target: bootstrap messages, hellos and unique-id text.
#include <string>

#include "bootstrap/handshake.h"
#include "bootstrap/messages.h"
#include "bootstrap/unique_id.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string why;
  if (auto r = eccl::bootstrap::decodeRegistration(data, size, &why)) {
    if (r->rank >= r->nranks) __builtin_trap();
  }
  eccl::bootstrap::decodeAddressTable(data, size, &why);
  if (size >= eccl::bootstrap::kHelloBytes) {
    eccl::bootstrap::Hello h;
    eccl::bootstrap::decodeHello(data, &h, &why);
  }
  try {
    eccl::bootstrap::uniqueIdFromText(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const eccl::Error&) {
  }
  return 0;
}
