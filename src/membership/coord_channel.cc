#include "membership/coord_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace eccl::membership {
namespace {

Mac seal(const Secret& key, uint8_t dir, uint64_t number, const Digest& body) {
  uint8_t buf[1 + 8 + sizeof(Digest)];
  buf[0] = dir;
  std::memcpy(buf + 1, &number, 8);
  std::memcpy(buf + 9, body.data(), body.size());
  return hmacSha256(key, buf, sizeof(buf));
}

}  // namespace

SealedChannel::SealedChannel(Fd fd, const Secret& key, bool isServer, std::string peer)
    : fd_(std::move(fd)), key_(key), sendDir_(isServer ? 'S' : 'C'), recvDir_(isServer ? 'C' : 'S'),
      peer_(std::move(peer)) {}

EncodedMessage encodeForSealing(const CoordMessage& m) {
  EncodedMessage out;
  out.kind = m.kind;
  out.entries = m.encoded;
  if (m.encoded) {
    out.rest = encodeCoordMessageAfterEntries(m);
    Sha256 h = m.encoded->hashed;
    h.update(out.rest.data(), out.rest.size());
    out.digest = h.finish();
  } else {
    out.rest = encodeCoordMessage(m);
    out.digest = sha256(out.rest.data(), out.rest.size());
  }
  return out;
}

std::vector<SealedChannel::Piece> SealedChannel::frame(const EncodedMessage& m) {
  std::vector<Piece> pieces;
  const uint32_t len = static_cast<uint32_t>((m.entries ? m.entries->bytes.size() : 0) + m.rest.size());
  Mac mac = seal(key_, sendDir_, sent_++, m.digest);
  std::vector<uint8_t> head(4);
  std::memcpy(head.data(), &len, 4);
  std::vector<uint8_t> tail;
  tail.reserve(4 + m.rest.size() + mac.size());
  if (m.entries) {
    pieces.push_back({std::move(head), nullptr});
    pieces.push_back({{}, m.entries});
  } else {
    tail = std::move(head);
  }
  tail.insert(tail.end(), m.rest.begin(), m.rest.end());
  tail.insert(tail.end(), mac.begin(), mac.end());
  pieces.push_back({std::move(tail), nullptr});
  return pieces;
}

void SealedChannel::send(const CoordMessage& m, Deadline deadline) {
  if (queuedBytes() > 0)  // messages are numbered in the order they are sealed
    fail(ecclInternalError, "coordinator channel to {}: a blocking send behind queued messages", peer_);
  std::vector<uint8_t> bytes;
  for (const Piece& p : frame(encodeForSealing(m))) bytes.insert(bytes.end(), p.data(), p.data() + p.size());
  sendAll(fd_.get(), bytes.data(), bytes.size(), deadline,
          fmt::format("coordinator channel to {} ({} message)", peer_, coordKindName(m.kind)));
}

bool SealedChannel::enqueue(const EncodedMessage& m, size_t limit) {
  if (queuedBytes() > limit) return false;
  for (Piece& p : frame(m)) {
    queued_ += p.size();
    out_.push_back(std::move(p));
  }
  return true;
}

void SealedChannel::flush() {
  while (!out_.empty()) {
    iovec iov[64];
    int count = 0;
    for (auto it = out_.begin(); it != out_.end() && count < 64; ++it, ++count) {
      const size_t skip = count == 0 ? outSent_ : 0;
      iov[count].iov_base = const_cast<uint8_t*>(it->data() + skip);
      iov[count].iov_len = it->size() - skip;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0)
      fail(ecclRemoteError, "coordinator channel to {}: send failed: {}", peer_, n < 0 ? strerror(errno) : "closed");
    size_t done = static_cast<size_t>(n);
    queued_ -= done;
    while (done > 0) {
      const size_t left = out_.front().size() - outSent_;
      if (done < left) {
        outSent_ += done;
        break;
      }
      done -= left;
      out_.pop_front();
      outSent_ = 0;
    }
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
    if (!macEqual(got, seal(key_, recvDir_, received_, sha256(body, len))))
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
