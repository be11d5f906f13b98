// libFuzzer target: the frame header decoder must reject or accept any
// 64 bytes without crashing, and what it accepts must re-encode identically.
#include <cstring>
#include <string>

#include "transport/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using eccl::transport::FrameHeader;
  if (size < FrameHeader::kSize) return 0;
  std::string why;
  auto h = eccl::transport::decodeFrame(data, &why);
  if (h) {
    uint8_t again[FrameHeader::kSize];
    eccl::transport::encodeFrame(*h, again);
    if (std::memcmp(again, data, FrameHeader::kSize) != 0) __builtin_trap();
  } else if (why.empty()) {
    __builtin_trap();
  }
  return 0;
}
