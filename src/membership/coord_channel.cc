#include "membership/coord_channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace eccl::membership {
namespace {

Mac seal(const Secret& key, uint8_t dir, uint64_t number, const uint8_t* body, size_t n) {
  std::vector<uint8_t> buf(9 + n);
  buf[0] = dir;
  std::memcpy(buf.data() + 1, &number, 8);
  if (n) std::memcpy(buf.data() + 9, body, n);
  return hmacSha256(key, buf.data(), buf.size());
}

}  // namespace

SealedChannel::SealedChannel(Fd fd, const Secret& key, bool isServer, std::string peer)
    : fd_(std::move(fd)), key_(key), sendDir_(isServer ? 'S' : 'C'), recvDir_(isServer ? 'C' : 'S'),
      peer_(std::move(peer)) {}

std::vector<uint8_t> SealedChannel::frame(const CoordMessage& m) {
  auto body = encodeCoordMessage(m);
  Mac mac = seal(key_, sendDir_, sent_++, body.data(), body.size());
  std::vector<uint8_t> out(4 + body.size() + mac.size());
  uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &len, 4);
  std::memcpy(out.data() + 4, body.data(), body.size());
  std::memcpy(out.data() + 4 + body.size(), mac.data(), mac.size());
  return out;
}

void SealedChannel::send(const CoordMessage& m, Deadline deadline) {
  if (queuedBytes() > 0)  // messages are numbered in the order they are sealed
    fail(ecclInternalError, "coordinator channel to {}: a blocking send behind queued messages", peer_);
  auto bytes = frame(m);
  sendAll(fd_.get(), bytes.data(), bytes.size(), deadline,
          fmt::format("coordinator channel to {} ({} message)", peer_, coordKindName(m.kind)));
}

bool SealedChannel::enqueue(const CoordMessage& m, size_t limit) {
  if (queuedBytes() > limit) return false;
  if (outSent_ > 0 && outSent_ == outbuf_.size()) outbuf_.clear(), outSent_ = 0;
  auto bytes = frame(m);
  outbuf_.insert(outbuf_.end(), bytes.begin(), bytes.end());
  return true;
}

void SealedChannel::flush() {
  while (outSent_ < outbuf_.size()) {
    ssize_t n = ::send(fd_.get(), outbuf_.data() + outSent_, outbuf_.size() - outSent_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      outSent_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fail(ecclRemoteError, "coordinator channel to {}: send failed: {}", peer_, n < 0 ? strerror(errno) : "closed");
  }
  // Keep the buffer from growing without bound: drop what went once it is
  // most of it.
  if (outSent_ > 0 && outSent_ * 2 >= outbuf_.size()) {
    outbuf_.erase(outbuf_.begin(), outbuf_.begin() + static_cast<std::ptrdiff_t>(outSent_));
    outSent_ = 0;
  }
}

void SealedChannel::takeWhole() {
  size_t pos = 0;
  while (inbuf_.size() - pos >= 4) {
    uint32_t len;
    std::memcpy(&len, inbuf_.data() + pos, 4);
    if (len > kMaxMessageBytes)
      fail(ecclRemoteError, "coordinator channel from {}: message of {} bytes exceeds the limit", peer_, len);
    size_t whole = 4 + len + sizeof(Mac);
    if (inbuf_.size() - pos < whole) break;
    const uint8_t* body = inbuf_.data() + pos + 4;
    Mac got;
    std::memcpy(got.data(), body + len, got.size());
    if (!macEqual(got, seal(key_, recvDir_, received_, body, len)))
      fail(ecclAuthError, "coordinator channel from {}: message {} fails authentication (forged, altered or replayed)",
           peer_, received_);
    ++received_;
    std::string why;
    auto m = decodeCoordMessage(body, len, &why);
    if (!m) fail(ecclRemoteError, "coordinator channel from {}: {}", peer_, why);
    ready_.push_back(std::move(*m));
    pos += whole;
  }
  inbuf_.erase(inbuf_.begin(), inbuf_.begin() + static_cast<std::ptrdiff_t>(pos));
}

bool SealedChannel::readAvailable() {
  uint8_t buf[16384];
  bool open = true;
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      inbuf_.insert(inbuf_.end(), buf, buf + n);
      continue;
    }
    if (n == 0) {
      open = false;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;
    // What arrived before the reset is authentic and may be the point (an
    // eviction, a view): whole messages are kept for drain() to hand over.
    const int error = errno;
    takeWhole();
    fail(ecclRemoteError, "coordinator channel from {}: receive failed: {}", peer_, strerror(error));
  }
  takeWhole();
  return open;
}

bool SealedChannel::drain(std::vector<CoordMessage>* out) {
  auto handOver = [&] {
    for (auto& m : ready_) out->push_back(std::move(m));
    ready_.clear();
  };
  try {
    bool open = readAvailable();
    handOver();
    return open;
  } catch (const Error&) {
    handOver();  // messages that were whole before the failure still count
    throw;
  }
}

CoordMessage SealedChannel::receive(Deadline deadline) {
  while (ready_.empty()) {
    pollfd p{fd_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(msUntil(deadline), 1 << 30))));
    if (rc == 0) fail(ecclTimeout, "coordinator channel from {}: no message before the deadline", peer_);
    if (rc < 0 && errno != EINTR) fail(ecclSystemError, "poll(): {}", strerror(errno));
    if (rc > 0) {
      bool open;
      try {
        open = readAvailable();
      } catch (const Error&) {
        if (ready_.empty()) throw;
        break;  // a message came whole before the failure: it is the answer
      }
      if (!open && ready_.empty()) fail(ecclRemoteError, "coordinator channel from {}: connection closed", peer_);
    }
  }
  CoordMessage m = std::move(ready_.front());
  ready_.pop_front();
  return m;
}

Fd connectToCoordinator(const UniqueIdData& id, Deadline deadline, const std::string& what) {
  const auto all = id.coordinators();
  if (all.size() == 1) return connectTo(id.root, deadline, what);
  // One try each per round: a refusal moves on at once, and a dead host's
  // address, which may swallow the connect, gets a slice.
  constexpr int64_t kSliceMs = 300;
  std::string tried;
  do {
    for (const auto& address : all) {
      try {
        return connectTo(address, std::min(deadline, deadlineAfterMs(kSliceMs)), what, [] { return true; });
      } catch (const Error& e) {
        tried = e.what();
      }
      if (Clock::now() >= deadline) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  fail(ecclTimeout, "{}: none of the job's coordinators ({}) took the connection before the deadline (last: {})",
       what, coordinatorLabel(id), tried);
}

std::string coordinatorLabel(const UniqueIdData& id) {
  std::string label = "the coordinator at " + id.root.str();
  for (size_t i = 0; i < id.spares.size(); ++i)
    label += (i + 1 == id.spares.size() ? " or " : ", ") + id.spares[i].str();
  return label;
}

}  // namespace eccl::membership
