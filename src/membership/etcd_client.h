// A small client of etcd's v3 API through its JSON gateway (HTTP/1.1 on the
// client port, every etcd since 3.4 serves it): the key-value calls, leases
// and transactions the replicated coordinator needs, nothing else. Every call
// has a deadline; a node that refuses, hangs or answers "no leader" is
// skipped for the next endpoint, so one dead etcd node costs a caller one
// connection attempt, and all of them down is one clear error naming each
// endpoint and what it said.
//
// Threads: a client holds no connection between calls and no mutable state
// but the index of the endpoint that answered last; calls from several
// threads are safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace eccl::membership {

struct EtcdKeyValue {
  std::string key, value;
  int64_t createRevision = 0, modRevision = 0, version = 0, lease = 0;
};

// One condition of a transaction. etcd compares a key that does not exist
// as create revision 0, version 0, empty value and lease 0.
struct EtcdCompare {
  enum class Target { kValue, kCreateRevision, kVersion, kLease };
  enum class Result { kEqual, kNotEqual };
  std::string key;
  Target target = Target::kValue;
  Result result = Result::kEqual;
  std::string value;  // kValue
  int64_t number = 0;  // the others

  static EtcdCompare valueIs(std::string key, std::string value);
  static EtcdCompare absent(std::string key);  // create revision 0
  static EtcdCompare leaseIs(std::string key, int64_t lease);
};

struct EtcdWrite {
  std::string key, value;
  int64_t lease = 0;
  bool erase = false;  // delete the key instead of putting it
  bool prefix = false;  // with erase: every key starting with `key`

  static EtcdWrite put(std::string key, std::string value, int64_t lease = 0);
  static EtcdWrite remove(std::string key);
  static EtcdWrite removePrefix(std::string prefix);
};

class EtcdClient {
 public:
  // endpoints: "IP:port" or "http://IP:port", comma-separated. `timeout` is
  // each call's whole budget across every endpoint.
  EtcdClient(const std::string& endpoints, std::chrono::milliseconds timeout);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // A lease of `ttlSeconds` (etcd may round it up to its minimum); returns its id.
  int64_t grantLease(int64_t ttlSeconds);
  // Refreshes the lease; returns the seconds it has left, 0 when it expired.
  int64_t keepAlive(int64_t lease);
  void revokeLease(int64_t lease);  // a lease already gone is not an error

  std::optional<EtcdKeyValue> get(const std::string& key);
  std::vector<EtcdKeyValue> getPrefix(const std::string& prefix);
  void put(const std::string& key, const std::string& value, int64_t lease = 0);

  // Applies `onSuccess` if every compare holds, `onFailure` otherwise,
  // atomically; returns whether the compares held.
  bool transaction(const std::vector<EtcdCompare>& compares, const std::vector<EtcdWrite>& onSuccess,
                   const std::vector<EtcdWrite>& onFailure = {});

  // The raw call: POSTs `body` (JSON) to `path` ("/v3/kv/put") and returns
  // the JSON answer; throws eccl::Error (ecclSystemError) naming every
  // endpoint tried and why when none answered within the timeout.
  std::string call(const std::string& path, const std::string& body);

 private:
  std::vector<std::string> endpoints_;
  std::chrono::milliseconds timeout_;
  std::atomic<size_t> preferred_{0};
};

// etcd's JSON carries bytes as base64.
std::string base64Encode(const std::string& bytes);
std::string base64Decode(const std::string& text);  // throws on malformed input

}  // namespace eccl::membership
