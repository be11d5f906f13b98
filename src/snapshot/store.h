// The snapshot store's data: host copies by name and version (immutable
// once made, shared with the threads that send or persist them), and the
// catalog that says which copy of each name is the committed one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/buffer_pool.h"

namespace eccl::snapshot {

constexpr size_t kMaxNameBytes = 255;

struct Entry {
  int64_t version = -1;
  uint64_t bytes = 0;
  uint32_t crc = 0;  // CRC32C of the bytes
  bool operator==(const Entry&) const = default;
};

using Bytes = std::shared_ptr<const Buffer>;
struct Copy {
  Entry entry;
  Bytes data;
  // Whether the bytes still match the entry's checksum.
  bool intact() const;
};
// A copy of `bytes` that `fill` writes into a buffer from `pool` (none:
// unpooled): a memcpy from host memory, a copy from a device.
Copy makeCopy(int64_t version, size_t bytes, BufferPool* pool, const std::function<void(uint8_t*)>& fill);

// The names one owner put in one version.
using CatalogDelta = std::map<std::string, Entry>;

struct Store {
  // This rank's own shards: the committed copy of each name, and the copies
  // of the version in progress.
  std::map<std::string, Copy> ownCommitted, ownPending;
  // Replicas this rank holds, by owner rank: committed, and pending by
  // (version, name) (an owner may be one version ahead of our commit).
  std::map<int, std::map<std::string, Copy>> heldCommitted;
  std::map<int, std::map<std::pair<int64_t, std::string>, Copy>> heldPending;
  // Every owner's dense committed view, indexed by rank.
  std::vector<CatalogDelta> catalog;

  // `version` committed with `deltas` (owner -> names it put): the copies
  // they name replace the committed ones; pending copies of versions up to
  // it that they do not name belonged to a failed version and are dropped.
  void promote(int64_t version, const std::map<int, CatalogDelta>& deltas, int self);
  // A failed version: its pending copies are dropped.
  void dropPending(int64_t version, int self);
  // The committed copy of (owner, name) this rank has, if it matches `entry`.
  const Copy* find(int owner, const std::string& name, const Entry& entry, int self) const;
};

// Wire forms (little-endian, as the rest of eccl's frames).
void encodeDelta(const CatalogDelta& delta, std::vector<uint8_t>& out);
// Throws ecclRemoteError naming `from` on a malformed encoding.
CatalogDelta decodeDelta(const uint8_t* data, size_t bytes, size_t* used, const std::string& from);
std::vector<uint8_t> encodeCatalog(const std::vector<CatalogDelta>& catalog);
std::vector<CatalogDelta> decodeCatalog(const std::vector<uint8_t>& bytes, const std::string& from);

}  // namespace eccl::snapshot
