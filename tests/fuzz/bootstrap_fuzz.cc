// libFuzzer target: coordinator messages, hellos and unique-id text.
#include <cstring>
#include <string>

#include "membership/handshake.h"
#include "membership/coord_messages.h"
#include "membership/unique_id.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string why;
  if (auto m = eccl::membership::decodeCoordMessage(data, size, &why)) {
    // Whatever decodes must encode back to the same bytes.
    auto again = eccl::membership::encodeCoordMessage(*m);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  }
  if (size >= eccl::membership::kHelloBytes) {
    eccl::membership::Hello h;
    eccl::membership::decodeHello(data, &h, &why);
  }
  try {
    eccl::membership::uniqueIdFromText(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const eccl::Error&) {
  }
  return 0;
}
