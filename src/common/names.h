// Names of the public enums as error messages print them.
#pragma once

#include "eccl.h"

namespace eccl {

const char* typeName(ecclDataType_t type);
const char* opName(ecclRedOp_t op);

}  // namespace eccl
