// The public data types and reduction ops: element sizes, and names as
// error messages print them.
#pragma once

#include <cstddef>

#include "eccl.h"

namespace eccl {

// Throws ecclInvalidArgument for a value outside the enum.
size_t typeSize(ecclDataType_t type);
const char* typeName(ecclDataType_t type);
const char* opName(ecclRedOp_t op);

}  // namespace eccl
