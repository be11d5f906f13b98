#include "common/types.h"

#include "common/error.h"

namespace eccl {

void invalidType(ecclDataType_t t) { fail(ecclInvalidArgument, "invalid data type {}", static_cast<int>(t)); }

static_assert(ecclInt8 == 0 && ecclUint8 == 1 && ecclInt32 == 2 && ecclUint32 == 3 && ecclInt64 == 4 &&
                  ecclUint64 == 5 && ecclFloat16 == 6 && ecclFloat32 == 7 && ecclFloat64 == 8 && ecclBfloat16 == 9,
              "typeSize's table follows the enum's order");

const char* typeName(ecclDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "half", "float", "double", "bfloat16"};
  return t >= 0 && t < ecclNumTypes ? names[t] : "invalid";
}

const char* opName(ecclRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < ecclNumOps ? names[op] : "invalid";
}

}  // namespace eccl
