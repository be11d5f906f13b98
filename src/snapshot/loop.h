// The snapshot layer's messages and its way of waiting: requests posted on
// the communicator's device, each with what to do once it completes, run
// from one thread that never drives the lanes (Device::waitAny).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/store.h"
#include "transport/frame.h"
#include "transport/transport.h"

namespace eccl::snapshot {

// Point-to-point sequence numbers of their own, in the transport's
// background class (a peer leaving in order with a standing receive
// pending is no failure), one counter per peer and stream.
constexpr uint64_t kSnapshotBit = transport::FrameHeader::kBackgroundBit;
enum Stream : uint32_t {
  kShardHead = 1, kShardData, kAck, kNoticeHead, kNoticeBody,  // replication
  kRequest, kReplyHead, kReplyData,                              // restore
};

struct ShardHead {
  int64_t version;
  uint64_t bytes;
  uint32_t crc, index, count;
  uint16_t nameBytes;
  char name[kMaxNameBytes + 1];
};
struct Ack {
  int64_t version;
  uint32_t ok;
  uint16_t nameBytes;  // the corrupt shard's name when !ok
  char name[kMaxNameBytes + 1];
};
struct NoticeHead {
  int64_t version;
  uint64_t bodyBytes;
  int32_t origin;
  uint32_t failed;  // the body is the reason, not a catalog delta
};
struct Request {
  int64_t version;
  int32_t owner;
  uint32_t end;  // the requester asks nothing more
  uint16_t nameBytes;
  char name[kMaxNameBytes + 1];
};
struct ReplyHead {
  uint64_t bytes;
  uint32_t crc, have;
};

// A message's bytes, owned, for a send that may outlive the caller's copy.
template <typename T>
std::shared_ptr<std::vector<uint8_t>> podBytes(const T& m) {
  auto p = reinterpret_cast<const uint8_t*>(&m);
  return std::make_shared<std::vector<uint8_t>>(p, p + sizeof(m));
}

template <typename T>
void setName(T& m, const std::string& name) {
  m.nameBytes = static_cast<uint16_t>(std::min(name.size(), kMaxNameBytes));
  std::memcpy(m.name, name.data(), m.nameBytes);
  m.name[m.nameBytes] = 0;
}
template <typename T>
std::string nameOf(const T& m) {
  return std::string(m.name, std::min<size_t>(m.nameBytes, kMaxNameBytes));
}

class Loop {
 public:
  // `generation` (agreed at each restore) keeps a message of an earlier
  // round from matching a receive of this one within the same epoch.
  Loop(transport::Device& device, uint64_t generation) : device_(device), base_(kBase | (generation & 0xfffff) << 40) {}
  ~Loop() { cancelAll("snapshot traffic stopped"); }
  using Done = std::function<void(const transport::Request&)>;

  uint64_t nextSend(int peer, Stream s) { return base_ | ++sent_[{peer, s}]; }
  uint64_t nextRecv(int peer, Stream s) { return base_ | ++received_[{peer, s}]; }
  // `keep` stays alive until the request completes (the bytes it reads or writes).
  void add(transport::RequestPtr r, Done done, std::shared_ptr<const void> keep = nullptr) {
    ops_.push_back({std::move(r), std::move(done), std::move(keep)});
  }
  bool empty() const { return ops_.empty(); }
  // Waits until something completes (or `until`), then runs the callbacks of
  // what completed; they may add more.
  void runOnce(Deadline until) {
    std::vector<transport::RequestPtr> waiting;
    for (auto& op : ops_) waiting.push_back(op.request);
    device_.waitAny(waiting, until);
    std::vector<Op> finished;
    for (auto it = ops_.begin(); it != ops_.end();) {
      if (it->request->state.load() == transport::Request::kPending) {
        ++it;
      } else {
        finished.push_back(std::move(*it));
        it = ops_.erase(it);
      }
    }
    // Every completion is handled even when one handler fails (a post to a
    // member the view no longer has); the first failure is rethrown after.
    std::exception_ptr first;
    for (auto& op : finished) {
      try {
        op.done(*op.request);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  // Lets the sends posted so far go (a notice others wait for), up to
  // `until`; receives are left to cancelAll.
  void drainSends(Deadline until) {
    auto sending = [&] {
      return std::any_of(ops_.begin(), ops_.end(), [](const Op& op) {
        return op.request->isSend && op.request->state.load() == transport::Request::kPending;
      });
    };
    while (sending() && Clock::now() < until) runOnce(std::min(until, Clock::now() + std::chrono::milliseconds(50)));
  }
  void cancelAll(const std::string& why) {
    for (auto& op : ops_) device_.cancel(op.request, why);
    ops_.clear();
  }

 private:
  struct Op {
    transport::RequestPtr request;
    Done done;
    std::shared_ptr<const void> keep;
  };
  static constexpr uint64_t kBase = transport::FrameHeader::kP2pBit | kSnapshotBit;
  transport::Device& device_;
  const uint64_t base_;
  std::vector<Op> ops_;
  std::map<std::pair<int, uint32_t>, uint64_t> sent_, received_;
};

}  // namespace eccl::snapshot
