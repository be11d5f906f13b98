#include "snapshot/store.h"

#include <cstring>

#include "common/crypto.h"
#include "common/error.h"

namespace eccl::snapshot {

bool Copy::intact() const {
  return data && data->size() == entry.bytes && crc32c(data->data(), data->size()) == entry.crc;
}

Copy makeCopy(int64_t version, size_t bytes, BufferPool* pool, const std::function<void(uint8_t*)>& fill) {
  auto buffer = pool ? pool->take(bytes) : unpooledBuffer(bytes);
  if (bytes) fill(buffer->data());
  Copy c;
  c.entry = {version, bytes, crc32c(buffer->data(), bytes)};
  c.data = std::move(buffer);
  return c;
}

void Store::promote(int64_t version, const std::map<int, CatalogDelta>& deltas, int self) {
  for (const auto& [owner, delta] : deltas) {
    if (owner >= static_cast<int>(catalog.size())) catalog.resize(static_cast<size_t>(owner) + 1);
    for (const auto& [name, entry] : delta) {
      catalog[static_cast<size_t>(owner)][name] = entry;
      if (owner == self) {
        auto it = ownPending.find(name);
        if (it != ownPending.end() && it->second.entry == entry) ownCommitted[name] = it->second;
        continue;
      }
      auto held = heldPending.find(owner);
      if (held == heldPending.end()) continue;
      auto it = held->second.find({entry.version, name});
      if (it != held->second.end() && it->second.entry == entry) heldCommitted[owner][name] = it->second;
    }
  }
  std::erase_if(ownPending, [&](const auto& kv) { return kv.second.entry.version <= version; });
  for (auto& [owner, pending] : heldPending)
    std::erase_if(pending, [&](const auto& kv) { return kv.first.first <= version; });
}

void Store::dropPending(int64_t version, int self) {
  std::erase_if(ownPending, [&](const auto& kv) { return kv.second.entry.version == version; });
  for (auto& [owner, pending] : heldPending)
    std::erase_if(pending, [&](const auto& kv) { return kv.first.first == version; });
}

const Copy* Store::find(int owner, const std::string& name, const Entry& entry, int self) const {
  const std::map<std::string, Copy>* copies = nullptr;
  if (owner == self) {
    copies = &ownCommitted;
  } else {
    auto it = heldCommitted.find(owner);
    if (it == heldCommitted.end()) return nullptr;
    copies = &it->second;
  }
  auto it = copies->find(name);
  if (it == copies->end() || !(it->second.entry == entry)) return nullptr;
  return &it->second;
}

namespace {
template <typename T>
void putRaw(std::vector<uint8_t>& out, T v) {
  // resize + memcpy: GCC 12 warns (falsely) about insert into an empty vector.
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
struct Reader {
  const uint8_t* data;
  size_t bytes, at = 0;
  const std::string& from;
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  void need(size_t n) {
    if (bytes - at < n)
      fail(ecclRemoteError, "snapshot catalog from {} is malformed: {} bytes end at {} of {}", from, n, at, bytes);
  }
};
}  // namespace

void encodeDelta(const CatalogDelta& delta, std::vector<uint8_t>& out) {
  putRaw<uint32_t>(out, static_cast<uint32_t>(delta.size()));
  for (const auto& [name, e] : delta) {
    putRaw<uint16_t>(out, static_cast<uint16_t>(name.size()));
    out.insert(out.end(), name.begin(), name.end());
    putRaw<int64_t>(out, e.version);
    putRaw<uint64_t>(out, e.bytes);
    putRaw<uint32_t>(out, e.crc);
  }
}

CatalogDelta decodeDelta(const uint8_t* data, size_t bytes, size_t* used, const std::string& from) {
  Reader in{data, bytes, 0, from};
  CatalogDelta delta;
  uint32_t count = in.get<uint32_t>();
  for (uint32_t i = 0; i < count; ++i) {
    uint16_t length = in.get<uint16_t>();
    if (length == 0 || length > kMaxNameBytes)
      fail(ecclRemoteError, "snapshot catalog from {} is malformed: a name of {} bytes", from, length);
    in.need(length);
    std::string name(reinterpret_cast<const char*>(data + in.at), length);
    in.at += length;
    Entry e;
    e.version = in.get<int64_t>();
    e.bytes = in.get<uint64_t>();
    e.crc = in.get<uint32_t>();
    delta[name] = e;
  }
  *used = in.at;
  return delta;
}

std::vector<uint8_t> encodeCatalog(const std::vector<CatalogDelta>& catalog) {
  std::vector<uint8_t> out;
  putRaw<uint32_t>(out, static_cast<uint32_t>(catalog.size()));
  for (const CatalogDelta& d : catalog) encodeDelta(d, out);
  return out;
}

std::vector<CatalogDelta> decodeCatalog(const std::vector<uint8_t>& bytes, const std::string& from) {
  Reader in{bytes.data(), bytes.size(), 0, from};
  uint32_t owners = in.get<uint32_t>();
  if (owners > (1u << 20)) fail(ecclRemoteError, "snapshot catalog from {} is malformed: {} owners", from, owners);
  std::vector<CatalogDelta> catalog(owners);
  for (auto& d : catalog) {
    size_t used = 0;
    d = decodeDelta(bytes.data() + in.at, bytes.size() - in.at, &used, from);
    in.at += used;
  }
  if (in.at != bytes.size()) fail(ecclRemoteError, "snapshot catalog from {} has {} trailing bytes", from, bytes.size() - in.at);
  return catalog;
}

}  // namespace eccl::snapshot
