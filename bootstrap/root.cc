#include "bootstrap/root.h"

#include <map>
#include <thread>

#include "bootstrap/handshake.h"
#include "bootstrap/messages.h"
#include "common/error.h"
#include "common/log.h"
#include "common/params.h"

namespace eccl::bootstrap {
namespace {

struct Arrival {
  Fd fd;
  std::string dataAddress;
};

void reject(int fd, const std::string& why, Deadline deadline) {
  try {
    sendMessage(fd, encodeAddressTable({why, {}}), deadline, "bootstrap root");
  } catch (const Error&) {
  }
}

void runRoot(UniqueIdData id, Fd listenFd) {
  const Deadline deadline = deadlineAfterMs(params::timeoutMs());
  std::map<uint32_t, Arrival> arrived;
  uint32_t nranks = 0;
  while (nranks == 0 || arrived.size() < nranks) {
    SockAddr from;
    Fd fd = acceptUntil(listenFd.get(), deadline, &from);
    if (!fd) {
      if (Clock::now() < deadline) continue;
      std::string missing;
      for (uint32_t r = 0; r < nranks; ++r)
        if (!arrived.count(r)) missing += fmt::format("{}{}", missing.empty() ? "" : ",", r);
      std::string why = fmt::format("bootstrap timed out: {} of {} ranks arrived (missing: {})",
                                    arrived.size(), nranks, missing.empty() ? "unknown" : missing);
      log::warn("{}", why);
      for (auto& [rank, a] : arrived) reject(a.fd.get(), why, deadlineAfterMs(1000));
      return;
    }
    std::string what = fmt::format("bootstrap root, connection from {}", from.str());
    try {
      Deadline hs = std::min(deadline, deadlineAfterMs(params::handshakeTimeoutMs()));
      authenticateAsServer(fd.get(), id.secret, id.jobId, hs, what);
      auto body = recvMessage(fd.get(), hs, what);
      std::string why;
      auto reg = decodeRegistration(body.data(), body.size(), &why);
      if (!reg) fail(ecclRemoteError, "{}: {}", what, why);
      if (nranks == 0) nranks = reg->nranks;
      if (reg->nranks != nranks) {
        reject(fd.get(), fmt::format("rank {} says nranks={}, earlier ranks said {}", reg->rank,
                                     reg->nranks, nranks), hs);
        continue;
      }
      if (arrived.count(reg->rank)) {
        reject(fd.get(), fmt::format("rank {} registered twice", reg->rank), hs);
        continue;
      }
      arrived[reg->rank] = Arrival{std::move(fd), reg->dataAddress};
    } catch (const Error& e) {
      log::warn("rejected: {}", e.what());
    }
  }
  AddressTable table;
  for (auto& [rank, a] : arrived) table.addresses.push_back(a.dataAddress);
  auto body = encodeAddressTable(table);
  for (auto& [rank, a] : arrived) {
    try {
      sendMessage(a.fd.get(), body, deadline, fmt::format("bootstrap root, rank {}", rank));
    } catch (const Error& e) {
      log::warn("{}", e.what());
    }
  }
}

}  // namespace

void startRoot(const UniqueIdData& id, Fd listenFd) {
  std::thread([id, fd = std::move(listenFd)]() mutable {
    try {
      runRoot(id, std::move(fd));
    } catch (const std::exception& e) {
      log::warn("bootstrap root stopped: {}", e.what());
    }
  }).detach();
}

std::vector<std::string> exchangeAddresses(const UniqueIdData& id, int rank, int nranks,
                                           const std::string& dataAddress, Deadline deadline) {
  std::string what = fmt::format("bootstrap of rank {} with root {}", rank, id.root.str());
  Fd fd = connectTo(id.root, deadline, what);
  Hello hello{Purpose::kBootstrap, id.jobId, static_cast<uint64_t>(rank), 0, 0};
  authenticateAsClient(fd.get(), id.secret, hello, deadline, what);
  sendMessage(fd.get(),
              encodeRegistration({static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks), dataAddress}),
              deadline, what);
  auto body = recvMessage(fd.get(), deadline, what);
  std::string why;
  auto table = decodeAddressTable(body.data(), body.size(), &why);
  if (!table) fail(ecclRemoteError, "{}: malformed answer: {}", what, why);
  if (!table->error.empty()) fail(ecclInvalidUsage, "{}: the root refused: {}", what, table->error);
  if (table->addresses.size() != static_cast<size_t>(nranks))
    fail(ecclRemoteError, "{}: root sent {} addresses for {} ranks", what, table->addresses.size(), nranks);
  return table->addresses;
}

}  // namespace eccl::bootstrap
