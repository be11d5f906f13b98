// Element-wise reductions for every type and op. float16 and bfloat16 are
// widened to float32 for the arithmetic; the collectives keep partial
// results in float32 and round once at the end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"
#include "eccl.h"

namespace eccl::coll {

using eccl::opName;
using eccl::typeName;
using eccl::typeSize;
bool isHalfType(ecclDataType_t type);

// dst[i] = a[i] op b[i]; dst may alias a or b. Avg reduces as a sum here:
// finishAverage divides once at the end.
void reduce(void* dst, const void* a, const void* b, size_t count, ecclDataType_t type, ecclRedOp_t op);
void finishAverage(void* buf, size_t count, ecclDataType_t type, int nranks);

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);  // round to nearest even
float bfloat16ToFloat(uint16_t h);
uint16_t floatToBfloat16(float f);  // round to nearest even
void widenToFloat(const void* in, float* out, size_t count, ecclDataType_t halfType);
void narrowFromFloat(const float* in, void* out, size_t count, ecclDataType_t halfType);

}  // namespace eccl::coll
