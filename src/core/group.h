// Group calls: between start() and end() operations are queued on this
// thread; end() posts every queued send and receive first and only then
// waits, so a ring of send/recv in one group cannot deadlock.
#pragma once

#include <functional>

#include "core/communicator.h"

namespace eccl::group {

bool active();
void start();
// post() runs at end() before any finish(); finish() waits or runs the op.
void enqueue(Communicator* comm, std::function<void()> post, std::function<void()> finish);
// Throws the first failure after every op has finished or failed; the
// failing communicator's last error is set.
void end();

}  // namespace eccl::group
