#include "membership/etcd_leadership.h"

#include "common/error.h"

namespace eccl::membership {

EtcdLeadership::EtcdLeadership(EtcdClient& etcd, std::string prefix, std::string candidate, int64_t ttlSeconds)
    : etcd_(etcd), leaderKey_(std::move(prefix) + "leader"), candidate_(std::move(candidate)), ttlSeconds_(ttlSeconds) {
  ECCL_CHECK_ARG(!candidate_.empty(), "a coordinator candidate needs a name");
  ECCL_CHECK_ARG(ttlSeconds_ > 0, "leadership TTL must be positive (got {})", ttlSeconds_);
}

bool EtcdLeadership::campaign() {
  if (leading_) return true;
  if (lease_ == 0 || etcd_.keepAlive(lease_) == 0) lease_ = etcd_.grantLease(ttlSeconds_);
  // Take the key if nobody holds it; if it already names this candidate
  // under this lease (an answer lost on the way back), that is leading too.
  leading_ = etcd_.transaction({EtcdCompare::absent(leaderKey_)}, {EtcdWrite::put(leaderKey_, candidate_, lease_)}) ||
             etcd_.transaction({EtcdCompare::valueIs(leaderKey_, candidate_), EtcdCompare::leaseIs(leaderKey_, lease_)},
                               {});
  return leading_;
}

bool EtcdLeadership::renew() {
  if (lease_ == 0) return false;
  if (etcd_.keepAlive(lease_) > 0) return leading_;
  lease_ = 0;
  leading_ = false;
  return false;
}

void EtcdLeadership::resign() {
  if (lease_ != 0) etcd_.revokeLease(lease_);  // the key goes with its lease
  lease_ = 0;
  leading_ = false;
}

bool EtcdLeadership::writeIfLeading(const std::vector<EtcdWrite>& writes, const std::vector<EtcdCompare>& extra) {
  if (!leading_) return false;
  std::vector<EtcdCompare> compares = {EtcdCompare::valueIs(leaderKey_, candidate_),
                                       EtcdCompare::leaseIs(leaderKey_, lease_)};
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
