#include "core/group.h"

#include <optional>
#include <vector>

#include "common/error.h"

namespace eccl::group {
namespace {

struct Task {
  Communicator* comm;
  std::function<void()> post;
  std::function<void()> finish;
  bool postFirst = false;
};

struct State {
  int depth = 0;
  std::vector<Task> tasks;
};

thread_local State state;

}  // namespace

bool active() { return state.depth > 0; }

int depth() { return state.depth; }

void start() { ++state.depth; }

void enqueue(Communicator* comm, std::function<void()> post, std::function<void()> finish, bool postFirst) {
  state.tasks.push_back({comm, std::move(post), std::move(finish), postFirst});
}

void end() {
  if (state.depth == 0) fail(ecclInvalidUsage, "ecclGroupEnd without a matching ecclGroupStart");
  if (--state.depth > 0) return;
  std::vector<Task> tasks = std::move(state.tasks);
  state.tasks.clear();
  std::optional<Error> first;
  std::vector<bool> posted(tasks.size(), false);
  auto record = [&](Task& t, const Error& e) {
    t.comm->setLastError(e.what());
    if (!first) first = e;
  };
  for (bool early : {true, false}) {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].postFirst != early) continue;
      try {
        if (tasks[i].post) tasks[i].post();
        posted[i] = true;
      } catch (const Error& e) {
        record(tasks[i], e);
      }
    }
  }
  // Finish everything that was posted, even after a failure: each wait has
  // its own deadline, and buffers must not be left in flight.
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!posted[i]) continue;
    try {
      if (tasks[i].finish) tasks[i].finish();
    } catch (const Error& e) {
      record(tasks[i], e);
    }
  }
  if (first) throw *first;
}

}  // namespace eccl::group
