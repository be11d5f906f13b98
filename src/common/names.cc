#include "common/names.h"

namespace eccl {

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
