// Restore after a view change, collective over the new view: the ranks
// agree on the newest committed version (if any rank committed it, every
// rank's shards reached their replicas), settle what was in flight, and
// every rank fetches the copies it should now have and lacks: a
// replacement its rank's own shards, a new holder the replicas it holds.
// Sources are asked in ring order from the owner; a missing or corrupt
// copy moves on to the next, and a name no survivor has is reported lost.
#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "snapshot/loop.h"
#include "snapshot/snapshots.h"

namespace eccl::snapshot {

int64_t Snapshots::restore() {
  if (comm_.isStandby()) fail(ecclInvalidUsage, "ecclSnapshotRestore: this standby has no rank yet");
  int replicas;
  bool fresh;
  int64_t committed;
  uint64_t generation;
  {
    MutexLock lock(mu_);
    if (!configured_) fail(ecclInvalidUsage, "ecclSnapshotRestore: call ecclSnapshotConfigure first");
    replicas = config_.replicas;
    fresh = fresh_;
    committed = committed_;
    generation = generation_;
  }
  stopEngine();
  std::vector<RankInfo> infos = gatherInfo(comm_, replicas, fresh, committed, generation, hostKey_, fresh ? 0 : size_);
  // A grow keeps every rank's number and adds fresh ranks at the end: the
  // copies still belong to the ranks they name. A shrink renumbers. The
  // verdict comes from every rank's record, so a newcomer in a view that
  // also shrank (a replacement and a shrink in one recovery) fails too.
  const int size = comm_.size();
  int64_t shrankFrom = 0;
  for (const RankInfo& info : infos) {
    if (info.fresh || info.viewSize == size) continue;
    bool grewByNewcomers = size > info.viewSize;
    for (int64_t r = info.viewSize; r < size && grewByNewcomers; ++r) grewByNewcomers = infos[static_cast<size_t>(r)].fresh;
    if (!grewByNewcomers) shrankFrom = info.viewSize;
  }
  if (shrankFrom) {
    {
      MutexLock lock(mu_);
      startOverDue_ = true;
    }
    fail(ecclInvalidUsage,
         "ecclSnapshotRestore: the view has {} ranks and the snapshots {}; snapshots follow ranks, so a view "
         "that shrank cannot restore them (call ecclSnapshotConfigure on every rank to start over)",
         size, shrankFrom);
  }
  adoptView(infos, "ecclSnapshotRestore");

  int64_t newest = -1;
  int source = -1;
  uint64_t maxGeneration = 0;
  for (int r = 0; r < size_; ++r) {
    const RankInfo& info = infos[static_cast<size_t>(r)];
    maxGeneration = std::max(maxGeneration, info.generation);
    if (!info.fresh && info.committed > newest) newest = info.committed, source = r;
  }
  generation_ = maxGeneration + 1;
  log::info("snapshot restore (rank {}, epoch {}): newest committed version {} (rank {}){}", comm_.rank(),
            comm_.epoch(), newest, source, fresh ? "; this rank restores its own" : "");
  std::vector<uint8_t> blob;
  if (rank_ == source) {
    MutexLock lock(mu_);
    blob = encodeCatalog(store_.catalog);
  }
  if (source >= 0) broadcastBytes(comm_, source, blob);

  // Settle: what the newest version names is committed everywhere (its
  // copies reached every holder before any rank committed it); anything
  // newer was never committed anywhere and is dropped.
  std::vector<CatalogDelta> catalog =
      source >= 0 ? decodeCatalog(blob, fmt::format("rank {}", source)) : std::vector<CatalogDelta>{};
  return redistribute(std::move(catalog), newest, fresh);
}

// Every rank knows `catalog` (committed at `newest`): pending copies it
// names are committed, the rest dropped, and each rank fetches the copies
// it should have (its own names when `fresh`, the replicas it holds).
int64_t Snapshots::redistribute(std::vector<CatalogDelta> catalog, int64_t newest, bool fresh) {
  catalog.resize(static_cast<size_t>(size_));
  std::vector<std::vector<int>> holders;
  for (int owner = 0; owner < size_; ++owner) holders.push_back(holdersOf(owner));
  std::vector<Need> needs;
  {
    MutexLock lock(mu_);
    std::map<int, CatalogDelta> all;
    for (int owner = 0; owner < size_; ++owner) all[owner] = catalog[static_cast<size_t>(owner)];
    if (!fresh) store_.promote(newest, all, rank_);
    store_.catalog = catalog;
    store_.ownPending.clear();
    store_.heldPending.clear();
    committed_ = newest;
    open_.reset();
    replicating_.reset();
    notices_.clear();
    failed_.clear();
    brokenWhy_.clear();
    for (int owner = 0; owner < size_; ++owner) {
      const auto& h = holders[static_cast<size_t>(owner)];
      const bool holds = owner != rank_ && std::find(h.begin(), h.end(), rank_) != h.end();
      if (!holds) store_.heldCommitted.erase(owner);
      // Its own names too, not only when fresh: after a restore that lost
      // some, a member that came as a standby is no longer fresh and still
      // lacks them (a later restore must say so again, not succeed).
      if (!holds && owner != rank_) continue;
      for (const auto& [name, entry] : catalog[static_cast<size_t>(owner)])
        if (const Copy* have = store_.find(owner, name, entry, rank_); !have || !have->intact())
          needs.push_back({owner, name, entry});
    }
    changed_.notifyAll();
  }

  RankInfo mine;
  mine.fresh = fresh ? 1 : 0;
  mine.needs = needs.size();
  log::info("snapshot restore (rank {}): {} cop{} to fetch", rank_, needs.size(), needs.size() == 1 ? "y" : "ies");
  std::vector<RankInfo> plan = gatherRecords(comm_, mine);
  std::vector<std::string> lost = fetch(needs, plan);

  mine.lost = 0;
  for (const std::string& name : lost) mine.lost += name.rfind(fmt::format("{}:", rank_), 0) == 0;
  std::vector<RankInfo> outcome = gatherRecords(comm_, mine);
  std::vector<std::string> losers;
  for (int r = 0; r < size_; ++r)
    if (outcome[static_cast<size_t>(r)].lost)
      losers.push_back(fmt::format("rank {} lost {} name(s)", r, outcome[static_cast<size_t>(r)].lost));
  {
    MutexLock lock(mu_);
    fresh_ = false;
    lostShards_ = !losers.empty();
  }
  startEngine();
  if (!losers.empty())
    fail(ecclRemoteError, "ecclSnapshotRestore: version {}: every replica of some shards is gone ({}){}", newest,
         fmt::join(losers, "; "), lost.empty() ? "" : fmt::format("; here: {}", fmt::join(lost, ", ")));
  return newest;
}

// Serves the others' requests and fetches this rank's needs, in one loop.
std::vector<std::string> Snapshots::fetch(const std::vector<Need>& needs, const std::vector<RankInfo>& plan) {
  transport::Device& device = comm_.device();
  Loop loop(device, generation_);
  std::vector<std::string> lost;

  auto send = [&](int peer, Stream s, const void* data, size_t bytes, std::shared_ptr<const void> keep) {
    auto r = device.isend(members_[peer], loop.nextSend(peer, s), s, data, bytes);
    loop.add(std::move(r), [](const transport::Request&) {}, std::move(keep));
  };

  // Serving: every rank with state answers every rank that needs something.
  int endsDue = 0;
  std::function<void(int)> serve = [&](int from) {
    auto request = std::make_shared<Request>();
    auto r = device.irecv(members_[from], loop.nextRecv(from, kRequest), kRequest, request.get(), sizeof(Request));
    loop.add(std::move(r), [&, from, request](const transport::Request& got) {
      if (got.state.load() != transport::Request::kDone || request->end) {
        endsDue--;
        return;
      }
      serve(from);
      ReplyHead head{0, 0, 0};
      Bytes data;
      {
        MutexLock lock(mu_);
        const auto& catalog = store_.catalog;
        if (request->owner >= 0 && request->owner < static_cast<int>(catalog.size())) {
          auto entry = catalog[static_cast<size_t>(request->owner)].find(nameOf(*request));
          if (entry != catalog[static_cast<size_t>(request->owner)].end() &&
              entry->second.version == request->version) {
            const Copy* copy = store_.find(request->owner, entry->first, entry->second, rank_);
            // Not checked here: the requester checks every copy it gets
            // and asks the next source when one fails (one pass, not two).
            if (copy) head = {copy->entry.bytes, copy->entry.crc, 1}, data = copy->data;
          }
        }
      }
      auto headBytes = podBytes(head);
      send(from, kReplyHead, headBytes->data(), headBytes->size(), headBytes);
      // Always a data message, empty when there is no copy: the requester
      // posted its receive with the request (fetch's ask).
      if (head.have && head.bytes) send(from, kReplyData, data->data(), data->size(), data);
      else send(from, kReplyData, nullptr, 0, nullptr);
    }, request);
  };
  if (!plan[static_cast<size_t>(rank_)].fresh) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && plan[static_cast<size_t>(r)].needs > 0) endsDue++, serve(r);
  }

  // Fetching: one copy at a time, sources in ring order from the owner.
  std::vector<int> sources;
  size_t item = 0, tried = 0;
  bool fetched = needs.empty();
  // A source that failed (not one that lacked the copy) may have held it:
  // the name is not lost, the restore is (recover and restore again).
  bool sourceFailed = false;
  std::string unreachable;
  std::function<void()> ask = [&] {
    while (item < needs.size()) {
      const Need& need = needs[item];
      sources.clear();
      for (int step = 0; step < size_; ++step) {
        int r = (need.owner + step) % size_;
        if (r != rank_ && !plan[static_cast<size_t>(r)].fresh) sources.push_back(r);
      }
      if (tried < sources.size()) break;
      if (sourceFailed && unreachable.empty())
        unreachable = fmt::format("'{}' of rank {}: a rank that may hold it failed while serving it", need.name,
                                  need.owner);
      else if (need.owner == rank_) lost.push_back(fmt::format("{}:{}", rank_, need.name));
      else log::warn("snapshot restore (rank {}): no copy of rank {}'s '{}' to hold", rank_, need.owner, need.name);
      item++, tried = 0, sourceFailed = false;
    }
    if (item == needs.size()) {
      fetched = true;
      Request end{};
      end.end = 1;
      auto endBytes = podBytes(end);
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && !plan[static_cast<size_t>(r)].fresh) send(r, kRequest, endBytes->data(), endBytes->size(), endBytes);
      return;
    }
    const Need& need = needs[item];
    const int from = sources[tried];
    auto request = std::make_shared<Request>();
    *request = Request{need.entry.version, need.owner, 0, 0, {}};
    setName(*request, need.name);
    // The head and the data are both received into place, posted before
    // the request goes: the data (a rendezvous over shared memory or RDMA)
    // then lands in the pool's buffer, not in staging to be copied again.
    // The reply is judged once both are in.
    struct Reply {
      ReplyHead head{};
      std::shared_ptr<Buffer> data;
      bool headIn = false, dataIn = false, headOk = false, dataOk = false;
    };
    auto reply = std::make_shared<Reply>();
    reply->data = pool_->take(need.entry.bytes);
    auto judge = [&, from, reply] {
      if (!reply->headIn || !reply->dataIn) return;
      const Need& need = needs[item];
      auto next = [&] {
        tried++;
        ask();
      };
      if (!reply->headOk) return next();
      Copy copy{need.entry, reply->data};
      if (!reply->dataOk || !copy.intact()) {
        log::warn("snapshot restore (rank {}): rank {}'s copy of '{}' is corrupt; asking another", rank_, from,
                  need.name);
        return next();
      }
      {
        MutexLock lock(mu_);
        if (need.owner == rank_) store_.ownCommitted[need.name] = copy;
        else store_.heldCommitted[need.owner][need.name] = copy;
      }
      item++, tried = 0, sourceFailed = false;
      ask();
    };
    auto r = device.irecv(members_[from], loop.nextRecv(from, kReplyHead), kReplyHead, &reply->head, sizeof(ReplyHead));
    auto r2 = device.irecvUpTo(members_[from], loop.nextRecv(from, kReplyData), kReplyData, reply->data->data(),
                               need.entry.bytes);
    send(from, kRequest, request.get(), sizeof(Request), request);
    loop.add(std::move(r), [&, reply, judge](const transport::Request& got) {
      const Need& need = needs[item];
      if (got.state.load() != transport::Request::kDone) sourceFailed = true;
      reply->headIn = true;
      reply->headOk = got.state.load() == transport::Request::kDone && reply->head.have &&
                      reply->head.bytes == need.entry.bytes && reply->head.crc == need.entry.crc;
      judge();
    }, reply);
    loop.add(std::move(r2), [&, reply, judge](const transport::Request& got) {
      if (got.state.load() != transport::Request::kDone) sourceFailed = true;
      reply->dataIn = true;
      reply->dataOk = got.state.load() == transport::Request::kDone && got.bytes == needs[item].entry.bytes;
      judge();
    }, reply);
  };
  if (!needs.empty()) ask();
  if (needs.empty() && plan[static_cast<size_t>(rank_)].needs == 0) fetched = true;

  const Deadline until = deadlineAfterMs(4 * comm_.timeoutMs());
  while (!fetched || endsDue > 0) {
    if (Clock::now() >= until)
      fail(ecclTimeout, "ecclSnapshotRestore (rank {}): {} after {} ms", rank_,
           fetched ? fmt::format("{} rank(s) never said they were done fetching", endsDue)
                   : fmt::format("fetching '{}' of rank {} is still under way", needs[item].name, needs[item].owner),
           4 * comm_.timeoutMs());
    loop.runOnce(std::min(until, Clock::now() + std::chrono::milliseconds(100)));
  }
  // The replies' sends may still be queued: let them go before the loop
  // (and the bytes it keeps) ends.
  while (!loop.empty() && Clock::now() < until) loop.runOnce(std::min(until, Clock::now() + std::chrono::milliseconds(100)));
  if (!unreachable.empty()) fail(ecclRemoteError, "ecclSnapshotRestore (rank {}): {}", rank_, unreachable);
  return lost;
}

}  // namespace eccl::snapshot
