// The public data types and reduction ops: element sizes, and names as
// error messages print them.
#pragma once

#include <cstddef>

#include "eccl.h"

namespace eccl {

[[noreturn]] void invalidType(ecclDataType_t type);
// Throws ecclInvalidArgument for a value outside the enum. Inline: every
// call asks it, a few times (an out-of-line switch was 3% of an 8 B
// allreduce's instructions).
inline size_t typeSize(ecclDataType_t type) {
  // In the enum's order: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16.
  static constexpr unsigned char kBytes[ecclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  if (type < 0 || type >= ecclNumTypes) invalidType(type);
  return kBytes[type];
}
const char* typeName(ecclDataType_t type);
const char* opName(ecclRedOp_t op);

}  // namespace eccl
