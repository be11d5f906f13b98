#include "core/sandbox_feed.h"

#include <new>
#include <set>

#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/frame.h"

namespace eccl::sandbox {

using transport::MemberId;
using transport::RequestPtr;

uint64_t recordingSeq(uint64_t index, uint32_t part) {
  using F = transport::FrameHeader;
  return F::kP2pBit | F::kBackgroundBit | F::kOutOfViewBit | (index << 2) | part;
}

int shipRecording(transport::Device& device, const Recording& recording, const std::vector<MemberId>& standbys,
                  std::map<MemberId, uint64_t>& shipped, int64_t timeoutMs) {
  const std::vector<uint8_t> table = encodeTable(recording);
  uint8_t announce[kAnnounceBytes];
  encodeAnnounce({static_cast<uint32_t>(recording.calls.size()), table.size(), recording.outputs.size()}, announce);
  const uint32_t crc = crc32c(recording.outputs.data(), recording.outputs.size());
  std::map<MemberId, std::vector<RequestPtr>> posted;
  for (MemberId standby : standbys) {
    if (!device.hasPeer(standby)) continue;
    const uint64_t index = shipped[standby]++;
    auto& r = posted[standby];
    r.push_back(device.isend(standby, recordingSeq(index, 0), 0, announce, sizeof(announce)));
    r.push_back(device.isend(standby, recordingSeq(index, 1), 0, table.data(), table.size()));
    if (!recording.outputs.empty())
      r.push_back(device.isendBulk(standby, recordingSeq(index, 2), 0, recording.outputs.data(),
                                   recording.outputs.size(), &crc));
  }
  const Deadline until = deadlineAfterMs(timeoutMs);
  auto pending = [&] {
    std::vector<RequestPtr> out;
    for (auto& [standby, requests] : posted)
      for (auto& r : requests)
        if (r->state.load() == transport::Request::kPending) out.push_back(r);
    return out;
  };
  for (auto left = pending(); !left.empty() && Clock::now() < until; left = pending()) device.waitAny(left, until);
  int whole = 0;
  for (auto& [standby, requests] : posted) {
    bool done = true;
    for (auto& r : requests) {
      if (r->state.load() == transport::Request::kPending)
        device.cancel(r, "the sandbox recording was not taken in time");
      if (r->state.load() != transport::Request::kDone) done = false;
    }
    if (done) whole++;
    else log::info("sandbox recording: standby {:016x} did not take it in {} ms", standby, timeoutMs);
  }
  return whole;
}

struct Feed::Incoming {
  uint64_t index = 0;
  bool body = false;  // announce received: table and outputs are on their way
  uint8_t announce[kAnnounceBytes];
  Announce sizes;
  std::vector<uint8_t> table;
  std::shared_ptr<Recording> recording;
  std::vector<RequestPtr> requests;
};

Feed::Feed(transport::Device& device, size_t maxOutputBytes) : device_(device), maxOutputBytes_(maxOutputBytes) {}

Feed::~Feed() { stop(); }

void Feed::setMembers(const std::vector<MemberId>& members) {
  MutexLock lock(mu_);
  members_ = members;
}

void Feed::start(int rank) {
  {
    MutexLock lock(mu_);
    if (rank != rank_) own_ = latest_ && latest_->rank == rank ? latest_ : nullptr;
    rank_ = rank;
  }
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void Feed::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  device_.notifyWaiters();
  thread_.join();
}

std::shared_ptr<const Recording> Feed::preferred() const {
  MutexLock lock(mu_);
  return own_ ? own_ : latest_;
}

void Feed::postAnnounce(MemberId m, Incoming& in) {
  in.body = false;
  in.requests = {device_.irecv(m, recordingSeq(in.index, 0), 0, in.announce, sizeof(in.announce))};
}

void Feed::withdraw(Incoming& in, const char* why) {
  for (auto& r : in.requests)
    if (r->state.load() == transport::Request::kPending) device_.cancel(r, why);
}

bool Feed::takeAnnounce(MemberId m, Incoming& in, std::string* why) {
  auto sizes = decodeAnnounce(in.announce, maxOutputBytes_, why);
  if (!sizes) return false;
  in.sizes = *sizes;
  in.body = true;
  in.table.assign(sizes->tableBytes, 0);
  in.recording = std::make_shared<Recording>();
  in.recording->outputs.assign(sizes->outputBytes, 0);
  in.requests = {device_.irecv(m, recordingSeq(in.index, 1), 0, in.table.data(), in.table.size())};
  if (sizes->outputBytes)
    in.requests.push_back(device_.irecv(m, recordingSeq(in.index, 2), 0, in.recording->outputs.data(),
                                        in.recording->outputs.size()));
  return true;
}

bool Feed::takeRecording(MemberId m, Incoming& in, std::string* why) {
  if (!decodeTable(in.table, in.sizes, in.recording.get(), why)) return false;
  log::info("sandbox: a recording of {} calls ({} bytes) from member {:016x} as rank {} of {}",
            in.recording->calls.size(), in.recording->outputs.size(), m, in.recording->rank, in.recording->nranks);
  {
    MutexLock lock(mu_);
    latest_ = std::move(in.recording);
    if (latest_->rank == rank_) own_ = latest_;
  }
  received_++;
  in.index++;
  in.table.clear();
  postAnnounce(m, in);
  return true;
}

bool Feed::advance(MemberId m, Incoming& in) {
  std::string why;
  bool warn = true;  // false: the member or the device went, nothing to warn about
  try {
    for (auto& r : in.requests)
      if (!device_.test(r, "receive")) return true;
    if (in.body ? takeRecording(m, in, &why) : takeAnnounce(m, in, &why)) return true;
  } catch (const std::bad_alloc&) {
    why = fmt::format("no memory for {} bytes of outputs", in.sizes.outputBytes);
  } catch (const std::exception& e) {  // the member left or failed, or the device closed
    why = e.what();
    warn = false;
  }
  if (warn) log::warn("sandbox: member {:016x}'s recording is refused: {}", m, why);
  else log::info("sandbox: no more recordings from member {:016x}: {}", m, why);
  withdraw(in, "the standby stopped listening");
  return false;
}

void Feed::run() {
  std::map<MemberId, Incoming> incoming;
  std::set<MemberId> gone;  // failed or spoke garbage: not asked again
  while (!stopping_) {
    std::vector<MemberId> members;
    {
      MutexLock lock(mu_);
      members = members_;
    }
    for (MemberId m : members) {
      if (incoming.count(m) || gone.count(m) || !device_.hasPeer(m)) continue;
      try {
        incoming[m].index = nextIndex_[m];
        postAnnounce(m, incoming[m]);
      } catch (const std::exception& e) {  // a closed or aborted device
        log::info("sandbox: no recordings from member {:016x}: {}", m, e.what());
        incoming.erase(m);
        gone.insert(m);
      }
    }
    std::vector<RequestPtr> waiting;
    for (auto& [m, in] : incoming)
      for (auto& r : in.requests) waiting.push_back(r);
    device_.waitAny(waiting, deadlineAfterMs(200));
    for (auto it = incoming.begin(); it != incoming.end();) {
      if (advance(it->first, it->second)) {
        ++it;
        continue;
      }
      gone.insert(it->first);
      it = incoming.erase(it);
    }
  }
  for (auto& [m, in] : incoming) {
    withdraw(in, "the sandbox ended");
    nextIndex_[m] = in.index + 1;
  }
}

}  // namespace eccl::sandbox
