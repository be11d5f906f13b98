// Runs every collective once on `comm` with deterministic data and checks
// the result element-wise; throws (RANK_CHECK) on the first wrong element.
#pragma once

#include <cstddef>

#include "eccl.h"

namespace eccl::test {

void checkEveryCollective(ecclComm_t comm, size_t count, bool inPlace);
// Allreduce of every type and op on a small vector, exact where the type allows.
void checkEveryTypeAndOp(ecclComm_t comm, size_t count);

}  // namespace eccl::test
