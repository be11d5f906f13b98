#include "common/types.h"

#include "common/error.h"

namespace eccl {

size_t typeSize(ecclDataType_t t) {
  switch (t) {
    case ecclInt8: case ecclUint8: return 1;
    case ecclFloat16: case ecclBfloat16: return 2;
    case ecclInt32: case ecclUint32: case ecclFloat32: return 4;
    case ecclInt64: case ecclUint64: case ecclFloat64: return 8;
    default: fail(ecclInvalidArgument, "invalid data type {}", static_cast<int>(t));
  }
}

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
