// The background engine: sends this rank's shards of the version being
// replicated to its holders (bulk class, bytes in flight capped), stores
// and acknowledges the shards other ranks send here, and passes each
// rank's "replicated" notice round the ring until every rank has them all.
#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "snapshot/loop.h"
#include "snapshot/snapshots.h"

namespace eccl::snapshot {
namespace {

struct Job {
  int64_t version = -1;
  std::vector<std::pair<std::string, Copy>> shards;
  std::vector<int> holders;
  std::vector<size_t> next;  // per holder: the next shard to post
  std::set<int> acksDue;
  size_t inFlight = 0;
  Clock::time_point lastProgress;
  bool done = false;
};

// Per owner and version, what a holder received.
struct Incoming {
  uint32_t count = 0, complete = 0;
  std::string corrupt;
};

}  // namespace

void Snapshots::engineMain() {
  transport::Device& device = comm_.device();
  Loop loop(device, generation_);
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const std::string self = fmt::format("snapshot replication (rank {})", rank_);
  std::optional<Job> job;
  const size_t cap = [&] {
    MutexLock lock(mu_);
    return config_.maxInFlightBytes;
  }();
  std::map<std::pair<int, int64_t>, Incoming> incoming;

  // Once the view changed, the members this engine knows may be gone from
  // the device (the switchover removes a failed one): nothing more is
  // posted, and restore starts a new engine over the new view.
  auto viewChanged = [&] { return comm_.currentEpoch() != epoch_; };
  auto sendTo = [&](int peer, Stream s, std::shared_ptr<std::vector<uint8_t>> bytes, bool bulk,
                    Loop::Done done) {
    if (viewChanged()) return;
    uint64_t seq = loop.nextSend(peer, s);
    auto r = bulk ? device.isendBulk(members_[peer], seq, s, bytes->data(), bytes->size())
                  : device.isend(members_[peer], seq, s, bytes->data(), bytes->size());
    loop.add(std::move(r), std::move(done), bytes);
  };

  auto ignore = [](const transport::Request&) {};

  // A notice (ours or one passing through) goes on to the right
  // neighbour unless that is where it started.
  auto forward = [&](const NoticeHead& head, std::shared_ptr<std::vector<uint8_t>> body) {
    if (size_ == 1 || head.origin == right) return;
    sendTo(right, kNoticeHead, podBytes(head), false, ignore);
    if (head.bodyBytes) sendTo(right, kNoticeBody, std::move(body), false, ignore);
  };
  auto record = [&](const NoticeHead& head, const std::vector<uint8_t>& body) {
    log::trace("{}: version {}: rank {} {}", self, head.version, head.origin, head.failed ? "failed" : "replicated");
    MutexLock lock(mu_);
    if (head.failed) {
      failVersionLocked(head.version, std::string(body.begin(), body.end()));
      return;
    }
    size_t used = 0;
    notices_[head.version][head.origin] =
        decodeDelta(body.data(), body.size(), &used, fmt::format("rank {}", head.origin));
    if (notices_[head.version].size() == static_cast<size_t>(size_)) commitLocked(head.version);
  };
  auto announce = [&](int64_t version, bool failed, const std::vector<uint8_t>& body) {
    NoticeHead head{version, body.size(), rank_, failed ? 1u : 0u};
    forward(head, std::make_shared<std::vector<uint8_t>>(body));
    record(head, body);
  };
  auto failJob = [&](const std::string& why) {
    if (!job || job->done) return;
    job->done = true;
    log::warn("{}: version {} failed: {}", self, job->version, why);
    announce(job->version, true, std::vector<uint8_t>(why.begin(), why.end()));
  };

  std::function<void()> postNoticeHead = [&] {
    if (viewChanged()) return;
    auto head = std::make_shared<NoticeHead>();
    uint64_t seq = loop.nextRecv(left, kNoticeHead);
    auto r = device.irecv(members_[left], seq, kNoticeHead, head.get(), sizeof(NoticeHead));
    loop.add(std::move(r), [&, head](const transport::Request& done) {
      if (done.state.load() != transport::Request::kDone) return;  // the view changed; restore() restarts us
      postNoticeHead();
      auto body = std::make_shared<std::vector<uint8_t>>(head->bodyBytes);
      if (head->bodyBytes > (256u << 20)) {  // the stream cannot be followed past it
        MutexLock lock(mu_);
        brokenWhy_ = fmt::format("rank {} sent a notice of {} bytes (malformed); snapshots stop until a restore",
                                 left, head->bodyBytes);
        log::warn("{}: {}", self, brokenWhy_);
        return;
      }
      if (head->bodyBytes == 0) {
        forward(*head, body);
        record(*head, *body);
        return;
      }
      if (viewChanged()) return;
      uint64_t bodySeq = loop.nextRecv(left, kNoticeBody);
      auto r2 = device.irecv(members_[left], bodySeq, kNoticeBody, body->data(), body->size());
      loop.add(std::move(r2), [&, head, body](const transport::Request& got) {
        if (got.state.load() != transport::Request::kDone) return;
        // On before taking it in: a rank that commits here may be torn
        // down at once, and the ranks after it still need the notice.
        forward(*head, body);
        try {
          record(*head, *body);
        } catch (const Error& e) {
          log::warn("{}: {}", self, e.what());
        }
      }, body);
    }, head);
  };

  // Holder side: shards of `owner`, head then data, acknowledged per version.
  std::function<void(int)> postShardHead = [&](int owner) {
    if (viewChanged()) return;
    auto head = std::make_shared<ShardHead>();
    uint64_t seq = loop.nextRecv(owner, kShardHead);
    auto r = device.irecv(members_[owner], seq, kShardHead, head.get(), sizeof(ShardHead));
    loop.add(std::move(r), [&, owner, head](const transport::Request& done) {
      if (done.state.load() != transport::Request::kDone) return;
      postShardHead(owner);
      std::shared_ptr<Buffer> data = pool_->take(head->bytes);
      auto landed = [&, owner, head, data](bool ok) {
        Incoming& in = incoming[{owner, head->version}];
        in.count = head->count;
        const std::string name = nameOf(*head);
        Copy copy;
        copy.entry = {head->version, head->bytes, head->crc};
        copy.data = data;
        if (ok && copy.intact()) {
          MutexLock lock(mu_);
          if (head->version > committed_) store_.heldPending[owner][{head->version, name}] = copy;
        } else if (in.corrupt.empty()) {
          in.corrupt = name;
        }
        if (++in.complete < in.count) return;
        Ack ack{head->version, in.corrupt.empty() ? 1u : 0u, 0, {}};
        setName(ack, in.corrupt);
        incoming.erase({owner, head->version});
        sendTo(owner, kAck, podBytes(ack), false, ignore);
      };
      if (head->bytes == 0) return landed(true);
      if (viewChanged()) return;
      uint64_t dataSeq = loop.nextRecv(owner, kShardData);
      auto r2 = device.irecv(members_[owner], dataSeq, kShardData, data->data(), data->size());
      loop.add(std::move(r2), [landed](const transport::Request& got) {
        if (got.state.load() == transport::Request::kDone) landed(true);
      }, data);
    }, head);
  };

  // Owner side: post what the cap allows; acks come per holder.
  auto pump = [&] {
    if (!job || job->done) return;
    for (size_t h = 0; h < job->holders.size(); ++h) {
      const int holder = job->holders[h];
      while (job->next[h] < job->shards.size() && !viewChanged()) {
        const Copy& copy = job->shards[job->next[h]].second;
        if (job->inFlight > 0 && job->inFlight + copy.entry.bytes > cap) return;
        ShardHead head{copy.entry.version, copy.entry.bytes, copy.entry.crc,
                       static_cast<uint32_t>(job->next[h]), static_cast<uint32_t>(job->shards.size()), 0, {}};
        setName(head, job->shards[job->next[h]].first);
        job->next[h]++;
        sendTo(holder, kShardHead, podBytes(head), false, ignore);
        if (copy.entry.bytes == 0) continue;
        job->inFlight += copy.entry.bytes;
        const size_t bytes = copy.entry.bytes;
        const int64_t version = job->version;
        uint64_t seq = loop.nextSend(holder, kShardData);
        auto r = device.isendBulk(members_[holder], seq, kShardData, copy.data->data(), bytes);
        loop.add(std::move(r), [&, holder, bytes, version](const transport::Request& sent) {
          if (!job || job->version != version) return;
          job->inFlight -= bytes;
          job->lastProgress = Clock::now();
          if (sent.state.load() != transport::Request::kDone)
            failJob(fmt::format("sending a shard to its replica on rank {}: {}", holder, sent.error));
        }, copy.data);
      }
    }
  };
  auto startJob = [&](int64_t version) {
    job.emplace();
    job->version = version;
    {
      MutexLock lock(mu_);
      for (auto& [name, copy] : store_.ownPending)
        if (copy.entry.version == version) job->shards.emplace_back(name, copy);
    }
    job->lastProgress = Clock::now();
    log::trace("{}: version {}: {} shard(s) to replicate", self, version, job->shards.size());
    if (!job->shards.empty()) job->holders = holdersOf(rank_);
    job->next.assign(job->holders.size(), 0);
    for (int holder : job->holders) {
      job->acksDue.insert(holder);
      auto ack = std::make_shared<Ack>();
      uint64_t seq = loop.nextRecv(holder, kAck);
      auto r = device.irecv(members_[holder], seq, kAck, ack.get(), sizeof(Ack));
      loop.add(std::move(r), [&, holder, ack, version](const transport::Request& got) {
        if (!job || job->version != version || job->done) return;
        if (got.state.load() != transport::Request::kDone)
          return failJob(fmt::format("waiting for its replica on rank {}: {}", holder, got.error));
        if (!ack->ok)
          return failJob(fmt::format("the replica on rank {} received a corrupt copy of '{}' (checksum mismatch)",
                                     holder, nameOf(*ack)));
        job->acksDue.erase(holder);
        log::trace("{}: version {}: rank {} acknowledged", self, version, holder);
        job->lastProgress = Clock::now();
      }, ack);
    }
  };

  try {
    for (int owner = 0; owner < size_; ++owner)
      if (owner != rank_) {
        auto holders = holdersOf(owner);
        if (std::find(holders.begin(), holders.end(), rank_) != holders.end()) postShardHead(owner);
      }
    if (size_ > 1) postNoticeHead();
  } catch (const Error& e) {
    log::warn("{}: {}", self, e.what());  // the view changed as it started; restore starts another
  }

  while (!stopping_.load()) {
    if (comm_.currentEpoch() != epoch_) {
      MutexLock lock(mu_);
      if (brokenWhy_.empty()) {
        brokenWhy_ = fmt::format("the view changed (epoch {} -> {}); every member calls ecclSnapshotRestore first",
                                 epoch_, comm_.currentEpoch());
        if (replicating_) failVersionLocked(*replicating_, brokenWhy_, /*dropCopies=*/false);
      }
    }
    std::optional<int64_t> handed;
    {
      MutexLock lock(mu_);
      if (brokenWhy_.empty() && replicating_ && (!job || job->version != *replicating_)) handed = replicating_;
    }
    try {
      if (handed) startJob(*handed);
      pump();
      if (job && !job->done && job->acksDue.empty() && std::all_of(job->next.begin(), job->next.end(), [&](size_t n) {
            return n == job->shards.size();
          }) && job->inFlight == 0) {
        job->done = true;
        CatalogDelta delta;
        for (auto& [name, copy] : job->shards) delta[name] = copy.entry;
        std::vector<uint8_t> body;
        encodeDelta(delta, body);
        announce(job->version, false, body);
      }
      if (job && !job->done && Clock::now() - job->lastProgress > std::chrono::milliseconds(comm_.timeoutMs()))
        failJob(fmt::format("no replica made progress for {} ms", comm_.timeoutMs()));
      loop.runOnce(Clock::now() + std::chrono::milliseconds(100));
    } catch (const Error& e) {
      // This thread has no caller to hand an error to: it fails the version
      // (every rank learns why) and goes on, and whatever fails while it
      // says so (the right neighbour gone with the view) is only logged.
      try {
        failJob(e.what());
      } catch (const Error& again) {
        log::warn("{}: {}", self, again.what());
      }
      if (job) job->done = true;
    }
  }
  // A notice others wait for must go; a peer that stopped must not hold a
  // teardown for long.
  try {
    loop.drainSends(deadlineAfterMs(std::min<int64_t>(comm_.timeoutMs(), 2000)));
  } catch (const Error& e) {
    log::warn("{}: while its last sends went: {}", self, e.what());
  }
  loop.cancelAll("snapshot replication stopped");
}

}  // namespace eccl::snapshot
