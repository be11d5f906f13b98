// Group calls: between start() and end() operations are queued on this
// thread; end() posts every queued send and receive first and only then
// waits, so a ring of send/recv in one group cannot deadlock.
#pragma once

#include <functional>

#include "core/communicator.h"

namespace eccl::group {

bool active();
// How many ecclGroupStart calls are open on this thread.
int depth();
void start();
// post() runs at end() before any finish(); finish() waits or runs the op.
// Ops with postFirst (receives) are posted before the others: data that
// arrives while a send is still being posted (a logged send copies its
// payload) then lands in place instead of waiting in a socket.
void enqueue(Communicator* comm, std::function<void()> post, std::function<void()> finish, bool postFirst = false);
// Throws the first failure after every op has finished or failed; the
// failing communicator's last error is set.
void end();

}  // namespace eccl::group
