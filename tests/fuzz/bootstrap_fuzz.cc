// libFuzzer target: coordinator messages, hellos and unique-id text.
#include <cstring>
#include <string>

#include "bootstrap/handshake.h"
#include "bootstrap/coord_messages.h"
#include "bootstrap/unique_id.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string why;
  if (auto m = eccl::bootstrap::decodeCoordMessage(data, size, &why)) {
    // Whatever decodes must encode back to the same bytes.
    auto again = eccl::bootstrap::encodeCoordMessage(*m);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  }
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
