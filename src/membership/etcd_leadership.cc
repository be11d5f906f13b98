#include "membership/etcd_leadership.h"

#include <algorithm>

#include "common/error.h"

namespace eccl::membership {

EtcdLeadership::EtcdLeadership(EtcdClient& etcd, std::string prefix, std::string candidate, int64_t ttlSeconds)
    : etcd_(etcd), leaderKey_(std::move(prefix) + "leader"), candidate_(std::move(candidate)), ttlSeconds_(ttlSeconds) {
  ECCL_CHECK_ARG(!candidate_.empty(), "a coordinator candidate needs a name");
  ECCL_CHECK_ARG(ttlSeconds_ > 0, "leadership TTL must be positive (got {})", ttlSeconds_);
}

namespace {

// The lease lasts at least TTL from a renewal's sending; trust 9/10 of it.
std::chrono::steady_clock::time_point trustedUntil(std::chrono::steady_clock::time_point sent, int64_t ttlSeconds) {
  return sent + std::chrono::milliseconds(ttlSeconds * 900);
}

}  // namespace

std::vector<EtcdCompare> EtcdLeadership::heldByMe() const {
  return {EtcdCompare::valueIs(leaderKey_, candidate_), EtcdCompare::leaseIs(leaderKey_, lease_)};
}

bool EtcdLeadership::leading() const { return leading_ && std::chrono::steady_clock::now() < validUntil_; }

bool EtcdLeadership::campaign() {
  if (leading()) return true;
  leading_ = false;
  const auto sent = std::chrono::steady_clock::now();
  if (lease_ == 0 || etcd_.keepAlive(lease_) == 0) lease_ = etcd_.grantLease(ttlSeconds_);
  // Take the key if nobody holds it; if it already names this candidate
  // under this lease (an answer lost on the way back), that is leading too.
  leading_ = etcd_.transaction({EtcdCompare::absent(leaderKey_)}, {EtcdWrite::put(leaderKey_, candidate_, lease_)}) ||
             etcd_.transaction(heldByMe(), {});
  if (leading_) validUntil_ = trustedUntil(sent, ttlSeconds_);
  return leading_;
}

bool EtcdLeadership::renew() {
  if (lease_ == 0) return false;
  const auto sent = std::chrono::steady_clock::now();
  int64_t left = 0;
  try {
    left = etcd_.keepAlive(lease_);
  } catch (const Error& e) {
    lastError_ = e.what();
    return leading();  // unknown: the lease's lower bound still holds, then it does not
  }
  if (left > 0) {
    validUntil_ = trustedUntil(sent, std::min(left, ttlSeconds_));
    return leading();
  }
  lease_ = 0;
  leading_ = false;
  lastError_ = "the leadership lease expired";
  return false;
}

void EtcdLeadership::resign() {
  leading_ = false;
  if (lease_ == 0) return;
  try {
    etcd_.revokeLease(lease_);  // the key goes with its lease
  } catch (const Error& e) {
    lastError_ = e.what();  // etcd out of reach: the lease runs out on its own
  }
  lease_ = 0;
}

bool EtcdLeadership::writeIfLeading(const std::vector<EtcdWrite>& writes, const std::vector<EtcdCompare>& extra) {
  // leading_, not leading(): past its own bound a leader may still try; the
  // transaction's compares decide, never its belief.
  if (!leading_) return false;
  std::vector<EtcdCompare> compares = heldByMe();
  compares.insert(compares.end(), extra.begin(), extra.end());
  if (etcd_.transaction(compares, writes)) return true;
  // Either an extra compare failed, or this candidate no longer leads.
  auto held = etcd_.get(leaderKey_);
  if (!held || held->value != candidate_ || held->lease != lease_) leading_ = false;
  return false;
}

std::string EtcdLeadership::holder() {
  auto held = etcd_.get(leaderKey_);
  return held ? held->value : std::string();
}

}  // namespace eccl::membership
