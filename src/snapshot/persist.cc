// The second level: a committed version written to a directory in the
// background, one file per rank and name (written, fsynced, renamed into
// place), each rank's manifest last; load() takes the newest version every
// rank's manifest names, after a whole-job restart or when a restore found
// shards in no memory (the directory must then be one every host reaches).
//
//   <dir>/v<version>/rank<r>/<name, hex>   the bytes
//   <dir>/v<version>/rank<r>.manifest      "name-hex version bytes crc" lines
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "snapshot/snapshots.h"

namespace eccl::snapshot {
namespace fs = std::filesystem;
namespace {

std::string hexName(const std::string& name) {
  std::string out;
  for (unsigned char c : name) out += fmt::format("{:02x}", c);
  return out;
}
std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

void fsyncPath(const fs::path& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail(ecclSystemError, "opening {} to sync it: {}", path.string(), strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(ecclSystemError, "fsync {}: {}", path.string(), strerror(errno));
}

// Written beside, synced, renamed: the name never shows a partial file.
void writeDurably(const fs::path& path, const void* data, size_t bytes) {
  fs::path temp = path;
  temp += ".partial";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(ecclSystemError, "creating {}: {}", temp.string(), strerror(errno));
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::write(fd, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail(ecclSystemError, "writing {}: {}", temp.string(), strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail(ecclSystemError, "syncing {}: {}", temp.string(), strerror(errno));
  fs::rename(temp, path);
  fsyncPath(path.parent_path(), true);
}

fs::path versionDir(const std::string& dir, int64_t version) { return fs::path(dir) / fmt::format("v{}", version); }
fs::path manifestPath(const std::string& dir, int64_t version, int rank) {
  return versionDir(dir, version) / fmt::format("rank{}.manifest", rank);
}

// The versions whose manifest this rank wrote, newest first.
std::vector<int64_t> manifestsOf(const std::string& dir, int rank) {
  std::vector<int64_t> versions;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 2 || name[0] != 'v') continue;
    try {
      int64_t v = std::stoll(name.substr(1));
      if (fs::exists(manifestPath(dir, v, rank))) versions.push_back(v);
    } catch (const std::exception&) {
    }
  }
  std::sort(versions.rbegin(), versions.rend());
  return versions;
}

void writeVersion(const std::string& dir, int rank, int64_t version, const std::map<std::string, Copy>& copies) {
  const fs::path rankDir = versionDir(dir, version) / fmt::format("rank{}", rank);
  fs::create_directories(rankDir);
  std::ostringstream manifest;
  for (const auto& [name, copy] : copies) {
    writeDurably(rankDir / hexName(name), copy.data->data(), copy.data->size());
    manifest << hexName(name) << ' ' << copy.entry.version << ' ' << copy.entry.bytes << ' ' << copy.entry.crc << '\n';
  }
  fsyncPath(versionDir(dir, version), true);
  const std::string text = manifest.str();
  writeDurably(manifestPath(dir, version, rank), text.data(), text.size());
  // Keep this rank's two newest versions: a peer still writing the newer
  // one can always fall back to the older.
  std::vector<int64_t> versions = manifestsOf(dir, rank);
  for (size_t i = 2; i < versions.size(); ++i) {
    std::error_code ec;
    fs::remove(manifestPath(dir, versions[i], rank), ec);
    fs::remove_all(versionDir(dir, versions[i]) / fmt::format("rank{}", rank), ec);
    if (fs::is_empty(versionDir(dir, versions[i]), ec)) fs::remove(versionDir(dir, versions[i]), ec);
  }
}

std::map<std::string, Copy> readVersion(const std::string& dir, int rank, int64_t version) {
  std::map<std::string, Copy> copies;
  const fs::path path = manifestPath(dir, version, rank);
  std::ifstream manifest(path);
  if (!manifest) fail(ecclSystemError, "cannot read {}", path.string());
  std::string hex;
  Entry entry;
  while (manifest >> hex >> entry.version >> entry.bytes >> entry.crc) {
    const fs::path file = versionDir(dir, version) / fmt::format("rank{}", rank) / hex;
    std::ifstream in(file, std::ios::binary);
    std::shared_ptr<Buffer> data = unpooledBuffer(entry.bytes);
    in.read(reinterpret_cast<char*>(data->data()), static_cast<std::streamsize>(entry.bytes));
    Copy copy{entry, data};
    if (!in || in.peek() != EOF || !copy.intact())
      fail(ecclSystemError, "{} does not match its manifest ({} bytes, CRC32C {:08x})", file.string(), entry.bytes,
           entry.crc);
    copies[unhex(hex)] = copy;
  }
  if (!manifest.eof()) fail(ecclSystemError, "{} is malformed", path.string());
  return copies;
}

}  // namespace

void Snapshots::persist(const std::string& directory) {
  if (directory.empty()) fail(ecclInvalidArgument, "ecclSnapshotPersist: the directory is empty");
  std::map<std::string, Copy> copies;
  int64_t version;
  {
    MutexLock lock(mu_);
    checkUsableLocked("ecclSnapshotPersist");
    if (persisting_) fail(ecclInvalidUsage, "ecclSnapshotPersist: a persist is under way (ecclSnapshotPersistWait)");
    if (committed_ < 0) fail(ecclInvalidUsage, "ecclSnapshotPersist: no version is committed yet");
    copies = store_.ownCommitted;  // the copies are immutable: no bytes copied here
    version = committed_;
    persisting_ = true;
    persistError_.clear();
  }
  if (persister_.joinable()) persister_.join();
  const int rank = rank_;
  persister_ = std::thread([this, directory, rank, version, copies = std::move(copies)] {
    std::string error;
    try {
      writeVersion(directory, rank, version, copies);
    } catch (const std::exception& e) {
      error = e.what();
      log::warn("ecclSnapshotPersist (rank {}): version {}: {}", rank, version, error);
    }
    MutexLock lock(mu_);
    persisting_ = false;
    if (error.empty()) persisted_ = version;
    persistError_ = error;
    changed_.notifyAll();
  });
}

int64_t Snapshots::waitPersisted(int64_t timeoutMs) {
  const Deadline until = deadlineAfterMs(timeoutMs > 0 ? timeoutMs : comm_.timeoutMs());
  MutexLock lock(mu_);
  while (persisting_)
    if (!changed_.waitUntil(mu_, until) && Clock::now() >= until)
      fail(ecclTimeout, "ecclSnapshotPersistWait: the persist is still writing after {} ms",
           timeoutMs > 0 ? timeoutMs : comm_.timeoutMs());
  if (!persistError_.empty()) fail(ecclSystemError, "ecclSnapshotPersistWait: {}", persistError_);
  return persisted_;
}

int64_t Snapshots::load(const std::string& directory) {
  {
    MutexLock lock(mu_);
    if (!configured_ || fresh_) fail(ecclInvalidUsage, "ecclSnapshotLoad: call ecclSnapshotConfigure first (as a member)");
    if ((committed_ >= 0 || open_ || replicating_) && !lostShards_)
      fail(ecclInvalidUsage,
           "ecclSnapshotLoad: this communicator has snapshots already; load into a new job, or after an "
           "ecclSnapshotRestore that found shards in no memory");
  }
  // A persist still writing may remove the version chosen below once done.
  if (persister_.joinable()) persister_.join();
  // The newest version whose manifest every rank has.
  std::vector<int64_t> mine = manifestsOf(directory, rank_);
  int64_t bound = INT64_MAX;
  int64_t version = -1;
  for (;;) {
    int64_t candidate = -1;
    for (int64_t v : mine)
      if (v <= bound) {
        candidate = v;
        break;
      }
    comm_.allReduce(&candidate, &candidate, 1, ecclInt64, ecclMin);
    if (candidate < 0) break;
    int64_t everyone = std::find(mine.begin(), mine.end(), candidate) != mine.end() ? 1 : 0;
    comm_.allReduce(&everyone, &everyone, 1, ecclInt64, ecclMin);
    if (everyone) {
      version = candidate;
      break;
    }
    bound = candidate - 1;
  }
  if (version < 0) fail(ecclInvalidUsage, "ecclSnapshotLoad: {} holds no version that every rank persisted", directory);
  std::map<std::string, Copy> copies;
  std::string error;
  try {
    copies = readVersion(directory, rank_, version);
  } catch (const Error& e) {
    error = e.what();
  }
  int64_t failedRank = error.empty() ? -1 : rank_;
  comm_.allReduce(&failedRank, &failedRank, 1, ecclInt64, ecclMax);
  if (failedRank >= 0)
    fail(ecclSystemError, "ecclSnapshotLoad: version {}: {}", version,
         error.empty() ? fmt::format("rank {} could not read its files", failedRank) : error);
  // Every rank learns every rank's names, then replicas are fetched anew.
  std::vector<CatalogDelta> catalog(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    std::vector<uint8_t> bytes;
    if (r == rank_) {
      CatalogDelta own;
      for (const auto& [name, copy] : copies) own[name] = copy.entry;
      encodeDelta(own, bytes);
    }
    broadcastBytes(comm_, r, bytes);
    size_t used = 0;
    catalog[static_cast<size_t>(r)] = decodeDelta(bytes.data(), bytes.size(), &used, fmt::format("rank {}", r));
  }
  stopEngine();
  {
    MutexLock lock(mu_);
    // After a loss the memory level is given up whole: every copy, held or
    // pending, is of versions the loaded one replaces.
    store_.ownCommitted = std::move(copies);
    store_.ownPending.clear();
    store_.heldCommitted.clear();
    store_.heldPending.clear();
  }
  generation_++;
  redistribute(std::move(catalog), version, /*fresh=*/false);
  return version;
}

}  // namespace eccl::snapshot
