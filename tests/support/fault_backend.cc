#include "tests/support/fault_backend.h"

#include <errno.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "transport/backend.h"
#include "transport/frame.h"

namespace eccl::test {

const char* faultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kClose: return "close";
    case FaultKind::kStall: return "stall";
    case FaultKind::kAgain: return "again";
    case FaultKind::kError: return "error";
    case FaultKind::kOneByte: return "one byte";
    case FaultKind::kFlipHeader: return "flip header";
    case FaultKind::kFlipPayload: return "flip payload";
    case FaultKind::kReorder: return "reorder";
  }
  return "?";
}

namespace {

using transport::FrameHeader;
using transport::MemberId;

// The script every fault lane reads. A rule's generation tells a lane it
// is new, so the lane counts frames from then on.
struct Script {
  std::mutex mu;
  struct Entry {
    FaultRule rule;
    uint64_t generation;
    int left;  // lanes it may still strike
  };
  std::vector<Entry> rules;
  uint64_t generation = 0;
  std::atomic<int> struck{0};
  std::atomic<int> swapped{0};  // reorders that put a frame behind the next one (not alone, late)
  // addSlowRead's: reads that sleep before they read.
  struct SlowRead {
    MemberId member;
    size_t atLeastBytes;
    int ms;
    int left;
    bool zeroCopyWrite = false;  // addSlowZeroCopyWrite's
  };
  std::vector<SlowRead> slowReads;
  std::atomic<bool> zeroCopy{false};  // allowZeroCopy: lanes opened from now on forward it
  std::atomic<int> slowBegun{0}, slowEnded{0};
};
Script& script() {
  static Script s;
  return s;
}

// Frame boundaries in the bytes a lane writes: the header is read as it
// goes by, and tells how many bytes of its frame follow on the lane.
struct FrameCursor {
  uint8_t header[FrameHeader::kSize] = {};
  size_t headerHave = 0;
  uint64_t bodyLeft = 0;
  uint64_t frames = 0;  // frames written whole
  // Where the current frame's payload starts in its body (after a signature).
  uint64_t payloadAt = 0, payloadBytes = 0, bodyDone = 0;

  // `at(index, header, frame, offset)`: byte `index` of p is byte `offset`
  // of frame `frame`'s header, or of its payload.
  using At = std::function<void(size_t index, bool header, uint64_t frame, uint64_t offset)>;
  void feed(const uint8_t* p, size_t n, const At& at = {}) {
    size_t i = 0;
    while (i < n) {
      if (headerHave < FrameHeader::kSize) {
        size_t take = std::min(n - i, FrameHeader::kSize - headerHave);
        if (at)
          for (size_t k = 0; k < take; ++k) at(i + k, true, frames, headerHave + k);
        std::memcpy(header + headerHave, p + i, take);
        headerHave += take;
        i += take;
        if (headerHave == FrameHeader::kSize) startBody();
        continue;
      }
      size_t take = static_cast<size_t>(std::min<uint64_t>(n - i, bodyLeft));
      if (at)
        for (size_t k = 0; k < take; ++k)
          if (bodyDone + k >= payloadAt && bodyDone + k < payloadAt + payloadBytes)
            at(i + k, false, frames, bodyDone + k - payloadAt);
      bodyLeft -= take, bodyDone += take, i += take;
      if (bodyLeft == 0) endFrame();
    }
  }
  // How many of the n bytes at p finish the frame being written.
  size_t toFrameEnd(const uint8_t* p, size_t n) const {
    FrameCursor dry = *this;
    size_t used = 0;
    while (used < n && dry.frames == frames) {
      size_t step = dry.headerHave < FrameHeader::kSize ? FrameHeader::kSize - dry.headerHave : dry.bodyLeft;
      step = std::min(step, n - used);
      dry.feed(p + used, step);
      used += step;
    }
    return used;
  }
  bool atBoundary() const { return headerHave == 0; }
  void startBody() {
    uint32_t length = 0;
    uint8_t flags = header[7];
    std::memcpy(&length, header + 12, sizeof(length));  // encodeFrame's layout (frame.cc)
    const bool inline_ = !(flags & (FrameHeader::kRendezvous | FrameHeader::kPrewritten));
    payloadAt = (flags & FrameHeader::kCallSignature) ? FrameHeader::kSignatureBytes : 0;
    payloadBytes = inline_ ? length : 0;
    bodyLeft = payloadAt + payloadBytes;
    bodyDone = 0;
    if (bodyLeft == 0) endFrame();
  }
  void endFrame() {
    headerHave = 0;
    ++frames;
  }
};

// kReorder. Holding: frame N's bytes are taken and kept; passing: frame
// N+1 goes on the lane; flushing: frame N follows it. With no frame N+1
// within forMs (its sender may be waiting for an answer to frame N),
// frame N goes alone, late.
struct Reorder {
  enum Phase { kHolding, kPassing, kFlushing } phase = kHolding;
  uint64_t frame = 0;
  Clock::time_point due{};
};

class FaultyConduit final : public transport::Conduit {
 public:
  FaultyConduit(std::unique_ptr<transport::Conduit> inner, MemberId self)
      : inner_(std::move(inner)), self_(self), zeroCopy_(script().zeroCopy.load()) {}
  const char* kind() const override { return inner_->kind(); }
  void attachedTo(MemberId peer, uint32_t lane) override {
    peer_ = peer;
    lane_ = static_cast<int>(lane);
    inner_->attachedTo(peer, lane);
  }
  std::string failure() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_ && (active_->kind == FaultKind::kError || active_->kind == FaultKind::kClose))
      return fmt::format("injected fault: {} after {} frames", faultName(active_->kind), active_->afterFrames);
    return inner_->failure();
  }
  int pollFd() const override { return inner_->pollFd(); }
  bool writableByPoll() const override { return inner_->writableByPoll(); }
  // Looked at on every pass, whatever the inner lane: a stalled write or
  // a held frame must go on when its time is up, with nothing to wake the
  // device but the device itself.
  bool pollsMemory() const override { return true; }
  void onPollReady() override { inner_->onPollReady(); }
  bool armWakeup(bool wantSpace) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (flushHeldIfDue() < 0) return false;
    return !faulting() && !reorder_ && inner_->armWakeup(wantSpace);
  }
  bool seesPeerReads() const override { return inner_->seesPeerReads(); }
  bool roomForBulk() const override { return inner_->roomForBulk(); }
  bool armBulkWakeup() override { return inner_->armBulkWakeup(); }
  // No zero-copy unless a test allowed it (allowZeroCopy) when the lane
  // opened: every other byte goes through write(), where the script reads it.
  size_t zeroCopyMinBytes() const override { return zeroCopy_ ? inner_->zeroCopyMinBytes() : 0; }
  std::optional<Window> expose(void* buffer, size_t bytes) override {
    return zeroCopy_ ? inner_->expose(buffer, bytes) : std::nullopt;
  }
  uint64_t pin(const void* buffer, size_t bytes) override { return zeroCopy_ ? inner_->pin(buffer, bytes) : 0; }
  void release(uint64_t handle) override {
    if (zeroCopy_) inner_->release(handle);
  }
  bool writeZeroCopy(uint64_t pinned, const void* buffer, size_t bytes, uint64_t address, uint32_t key) override {
    const bool slow = sleepIfSlow(bytes, /*zeroCopyWrite=*/true);
    const bool started = inner_->writeZeroCopy(pinned, buffer, bytes, address, key);
    if (slow) script().slowEnded++;
    return started;
  }
  uint64_t zeroCopyWritesDone() const override { return inner_->zeroCopyWritesDone(); }
  bool writesZeroCopyBesideCalls() const override { return inner_->writesZeroCopyBesideCalls(); }

  // As the inner lane's read: the script's state below is this conduit's
  // own lock's, which a read holds across the inner read (a write beside
  // it waits for the copy; the device lock is not held then).
  bool readsBesideCalls() const override { return inner_->readsBesideCalls(); }

  ssize_t read(void* into, size_t n) override {
    const bool slow = sleepIfSlow(n, /*zeroCopyWrite=*/false);
    std::lock_guard<std::mutex> lock(mu_);
    flushHeldIfDue();  // a failure shows on the next write, or in the inner read
    if (broken()) {
      errno = active_->kind == FaultKind::kClose ? ECONNRESET : EIO;
      return -1;
    }
    const ssize_t rc = inner_->read(into, n);
    if (slow) script().slowEnded++;
    return rc;
  }

  ssize_t write(const iovec* iov, int count) override {
    std::lock_guard<std::mutex> lock(mu_);
    pickUp();
    if (broken()) {
      errno = active_->kind == FaultKind::kClose ? EPIPE : EIO;
      return -1;
    }
    if (active_ && Clock::now() < until_) {
      if (active_->kind == FaultKind::kStall) return 0;
      if (active_->kind == FaultKind::kAgain) {
        errno = EAGAIN;
        return -1;
      }
    }
    flat_.clear();
    for (int i = 0; i < count; ++i)
      flat_.insert(flat_.end(), static_cast<const uint8_t*>(iov[i].iov_base),
                   static_cast<const uint8_t*>(iov[i].iov_base) + iov[i].iov_len);
    if (reorder_) {
      if (reorder_->phase == Reorder::kHolding) return hold();
      if (reorder_->phase == Reorder::kPassing && !(cursor_.atBoundary() && Clock::now() >= reorder_->due))
        return pass();
      reorder_->phase = Reorder::kFlushing;
      if (int rc = flushHeld(); rc <= 0) return rc;  // the held frame goes before anything else
    }
    size_t n = flat_.size();
    if (pending_ && (pending_->kind == FaultKind::kFlipHeader || pending_->kind == FaultKind::kFlipPayload)) flip();
    if (active_ && active_->kind == FaultKind::kOneByte && Clock::now() < until_) n = std::min<size_t>(n, 1);
    iovec one{flat_.data(), n};
    ssize_t wrote = inner_->write(&one, 1);
    if (wrote > 0) {
      cursor_.feed(flat_.data(), static_cast<size_t>(wrote));
      written_ += static_cast<uint64_t>(wrote);
      if (flipAt_ && *flipAt_ < written_) pending_.reset(), flipAt_.reset();  // flipped on the wire: done
    }
    return wrote;
  }

 private:
  // Outside this conduit's lock: the device's calls on the lane go on.
  bool sleepIfSlow(size_t n, bool zeroCopyWrite) {
    Script& s = script();
    int ms = -1;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      for (auto& r : s.slowReads)
        if (r.left > 0 && r.zeroCopyWrite == zeroCopyWrite && (r.member == kAnyMember || r.member == self_) &&
            n >= r.atLeastBytes) {
          --r.left;
          ms = r.ms;
          break;
        }
    }
    if (ms < 0) return false;
    s.slowBegun++;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return true;
  }

  bool faulting() const { return active_ && (broken() || Clock::now() < until_); }
  bool broken() const {
    return active_ && (active_->kind == FaultKind::kClose || active_->kind == FaultKind::kError);
  }

  // Takes new rules for this member; strikes one whose frame count is
  // reached, at a frame boundary.
  void pickUp() {
    if (reorder_) return;  // one fault at a time
    Script& s = script();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!pending_) {
      for (auto& e : s.rules) {
        if (e.generation <= seenGeneration_ || e.left == 0) continue;
        if (e.rule.member != kAnyMember && e.rule.member != self_) continue;
        if (e.rule.peer != kAnyMember && e.rule.peer != peer_) continue;
        if (e.rule.lane >= 0 && e.rule.lane != lane_) continue;
        pending_ = e.rule;
        pendingGeneration_ = e.generation;
        startFrames_ = cursor_.frames + (cursor_.headerHave > 0 ? 1 : 0);
        break;
      }
    }
    if (!pending_) return;
    seenGeneration_ = std::max(seenGeneration_, pendingGeneration_);
    const bool atBoundary = cursor_.headerHave == 0;
    if (!atBoundary || cursor_.frames < startFrames_ + static_cast<uint64_t>(pending_->afterFrames)) return;
    if (pending_->kind == FaultKind::kFlipHeader || pending_->kind == FaultKind::kFlipPayload) return;  // flip() strikes
    strike(s);
  }

  ssize_t hold() {
    const size_t take = cursor_.toFrameEnd(flat_.data(), flat_.size());
    held_.insert(held_.end(), flat_.begin(), flat_.begin() + static_cast<std::ptrdiff_t>(take));
    cursor_.feed(flat_.data(), take);
    written_ += take;
    if (cursor_.frames > reorder_->frame) reorder_->phase = Reorder::kPassing;
    return static_cast<ssize_t>(take);
  }
  ssize_t pass() {
    iovec all{flat_.data(), flat_.size()};
    ssize_t wrote = inner_->write(&all, 1);
    if (wrote <= 0) return wrote;
    cursor_.feed(flat_.data(), static_cast<size_t>(wrote));
    written_ += static_cast<uint64_t>(wrote);
    if (cursor_.frames > reorder_->frame + 1) {
      script().swapped++;
      reorder_->phase = Reorder::kFlushing;
      flushHeld();  // or on the next write, read or look
    }
    return wrote;
  }
  // 1: the held frame is out (the reorder is over), 0: not all of it fit,
  // -1: the lane broke (errno set).
  int flushHeld() {
    while (heldDone_ < held_.size()) {
      iovec rest{held_.data() + heldDone_, held_.size() - heldDone_};
      ssize_t wrote = inner_->write(&rest, 1);
      if (wrote < 0) return -1;
      if (wrote == 0) return 0;
      heldDone_ += static_cast<size_t>(wrote);
    }
    held_.clear();
    heldDone_ = 0;
    reorder_.reset();
    active_.reset();
    return 1;
  }
  int flushHeldIfDue() {
    if (!reorder_) return 1;
    if (reorder_->phase == Reorder::kPassing && cursor_.atBoundary() && Clock::now() >= reorder_->due)
      reorder_->phase = Reorder::kFlushing;
    return reorder_->phase == Reorder::kFlushing ? flushHeld() : 0;
  }

  void strike(Script& s) {
    auto it = std::find_if(s.rules.begin(), s.rules.end(), [&](auto& e) { return e.generation == pendingGeneration_; });
    if (it == s.rules.end() || it->left == 0) {  // cleared, or used up on other lanes
      pending_.reset();
      return;
    }
    --it->left;
    s.struck++;
    active_ = pending_;
    until_ = Clock::now() + std::chrono::milliseconds(active_->forMs);
    pending_.reset();
    if (active_->kind == FaultKind::kReorder) {
      reorder_.emplace();
      reorder_->frame = cursor_.frames;
      reorder_->due = until_;
    }
  }

  // Flips one byte of the frame the pending rule names in the copy being
  // written (a byte of its sequence number, which the header checksum
  // covers; or its payload's first byte, of the first frame from there
  // that has one), at one place in the stream however the writes split.
  void flip() {
    if (!flipAt_) {
      const uint64_t target = startFrames_ + static_cast<uint64_t>(pending_->afterFrames);
      const bool header = pending_->kind == FaultKind::kFlipHeader;
      FrameCursor dry = cursor_;
      dry.feed(flat_.data(), flat_.size(), [&](size_t at, bool isHeader, uint64_t frame, uint64_t offset) {
        if (flipAt_ || frame < target) return;
        if (header ? (isHeader && frame == target && offset == 24) : (!isHeader && offset == 0)) flipAt_ = written_ + at;
      });
      if (!flipAt_) return;
      Script& s = script();
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = std::find_if(s.rules.begin(), s.rules.end(), [&](auto& e) { return e.generation == pendingGeneration_; });
      if (it == s.rules.end() || it->left == 0) {
        pending_.reset(), flipAt_.reset();
        return;
      }
      --it->left, s.struck++;
    }
    if (*flipAt_ >= written_ && *flipAt_ < written_ + flat_.size()) flat_[*flipAt_ - written_] ^= 0x5a;
  }

  mutable std::mutex mu_;
  std::unique_ptr<transport::Conduit> inner_;
  const bool zeroCopy_;
  const MemberId self_;
  MemberId peer_ = kAnyMember;  // until the device attaches the lane
  int lane_ = -1;
  FrameCursor cursor_;
  std::optional<Reorder> reorder_;
  std::vector<uint8_t> held_;
  size_t heldDone_ = 0;
  std::vector<uint8_t> flat_;
  uint64_t seenGeneration_ = 0, pendingGeneration_ = 0, startFrames_ = 0;
  uint64_t written_ = 0;  // bytes this lane wrote
  std::optional<uint64_t> flipAt_;
  std::optional<FaultRule> pending_, active_;
  Clock::time_point until_{};
};

class FaultBackend final : public transport::Backend {
 public:
  FaultBackend(const char* name, std::unique_ptr<transport::Backend> inner, MemberId self)
      : name_(name), inner_(std::move(inner)), self_(self) {}
  const char* name() const override { return name_; }
  std::string address() const override { return inner_->address(); }
  std::string describe() const override { return std::string(name_) + " over " + inner_->describe(); }
  int listenFd() const override { return inner_->listenFd(); }
  transport::BackendCounters counters() const override { return inner_->counters(); }
  Fd dial(MemberId member, const std::string& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override {
    return inner_->dial(member, address, deadline, what, giveUp);
  }
  Fd accept(std::string* from) override { return inner_->accept(from); }
  std::unique_ptr<transport::Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override {
    return std::make_unique<FaultyConduit>(inner_->openDialed(std::move(stream), deadline, what), self_);
  }
  std::unique_ptr<transport::Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override {
    return std::make_unique<FaultyConduit>(inner_->openAccepted(std::move(stream), deadline, what), self_);
  }

 private:
  const char* name_;
  std::unique_ptr<transport::Backend> inner_;
  const MemberId self_;
};

const transport::BackendSpec& wrapped(const char* name) {
  for (const auto& spec : transport::registeredBackends())
    if (std::string(spec.name) == name) return spec;
  fail(ecclInternalError, "fault back end: no '{}' back end to wrap", name);
}

}  // namespace

void registerFaultBackends() {
  static std::once_flag once;
  std::call_once(once, [] {
    transport::registerBackend({"fault-tcp", true,
                                [](const transport::BackendOptions& o) -> std::unique_ptr<transport::Backend> {
                                  return std::make_unique<FaultBackend>("fault-tcp", wrapped("tcp").create(o), o.self);
                                },
                                false, /*onlyByName=*/true});
    transport::registerBackend({"fault-shm", false,
                                [](const transport::BackendOptions& o) -> std::unique_ptr<transport::Backend> {
                                  return std::make_unique<FaultBackend>("fault-shm", wrapped("shm").create(o), o.self);
                                },
                                false, /*onlyByName=*/true});
  });
}

void addFault(const FaultRule& rule) {
  Script& s = script();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rules.push_back({rule, ++s.generation, std::max(1, rule.times)});
}

void clearFaults() {
  Script& s = script();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& e : s.rules) e.left = 0;
  s.slowReads.clear();
  s.zeroCopy = false;
}

int faultsStruck() { return script().struck.load(); }

transport::DeviceOptions faultDeviceOptions(const std::string& backend, int lanes, uint64_t jobId) {
  registerFaultBackends();
  transport::DeviceOptions o;
  o.backends = {backend};
  o.ringBytes = 64 << 10;
  o.jobId = o.commId = jobId;
  o.secret.fill(static_cast<uint8_t>(jobId));
  o.lanes = lanes;
  o.ifname = "lo";
  o.handshakeTimeoutMs = 2000;
  o.self = 0;
  return o;
}

std::vector<uint8_t> patternBytes(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

void addSlowRead(MemberId member, size_t atLeastBytes, int ms, int times) {
  Script& s = script();
  std::lock_guard<std::mutex> lock(s.mu);
  s.slowReads.push_back({member, atLeastBytes, ms, times});
}

void addSlowZeroCopyWrite(MemberId member, int ms, int times) {
  Script& s = script();
  std::lock_guard<std::mutex> lock(s.mu);
  s.slowReads.push_back({member, 0, ms, times, /*zeroCopyWrite=*/true});
}

void allowZeroCopy(bool on) { script().zeroCopy = on; }

int slowReadsBegun() { return script().slowBegun.load(); }
int slowReadsEnded() { return script().slowEnded.load(); }
int framesSwapped() { return script().swapped.load(); }

}  // namespace eccl::test
