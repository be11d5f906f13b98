#include <arpa/inet.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/ibverbs/library.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {
namespace {

struct DeviceList {
  ibv_device** list = nullptr;
  int count = 0;
  DeviceList() { list = verbs().get_device_list(&count); }
  ~DeviceList() {
    if (list) verbs().free_device_list(list);
  }
};

bool ipv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}

bool linkLocal(const ibv_gid& g) { return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80; }

bool unset(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b) return false;
  return true;
}

std::string gidText(const ibv_gid& g) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.raw, text, sizeof(text));
  return text;
}

const char* gidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown type";
  }
}

// RoCE v2 (routable) with an IPv4 address first, what Soft-RoCE and most
// RoCE fabrics are set up with; then RoCE v2 with a global IPv6 address;
// then index 0 (InfiniBand, or RoCE v1 as a last resort).
int chooseGid(ibv_context* context, uint8_t port, int tableLength) {
  int best = -1, bestRank = 0;
  for (int i = 0; i < tableLength; ++i) {
    ibv_gid_entry e{};
    if (verbs().queryGid(context, port, static_cast<uint32_t>(i), &e) != 0 || unset(e.gid)) continue;
    int rank = 0;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && ipv4Mapped(e.gid)) rank = 3;
    else if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && !linkLocal(e.gid)) rank = 2;
    if (rank > bestRank) best = i, bestRank = rank;
  }
  return best >= 0 ? best : 0;
}

}  // namespace

std::string describeDevices() {
  DeviceList devices;
  if (!devices.list || devices.count == 0) return "no RDMA device";
  std::string out;
  for (int d = 0; d < devices.count; ++d) {
    std::string entry = verbs().get_device_name(devices.list[d]);
    if (ibv_context* c = verbs().open_device(devices.list[d])) {
      ibv_device_attr attr{};
      if (verbs().query_device(c, &attr) == 0)
        for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
          ibv_port_attr pa{};
          if (verbs().queryPort(c, p, &pa) == 0)
            entry += fmt::format(" (port {} {})", p, verbs().port_state_str(pa.state));
        }
      verbs().close_device(c);
    }
    out += (out.empty() ? "" : ", ") + entry;
  }
  return out;
}

std::unique_ptr<Context> Context::open(const std::string& hca, int gidIndex) {
  std::string wantName = hca;
  int wantPort = 0;
  if (auto colon = hca.find(':'); colon != std::string::npos) {
    wantName = hca.substr(0, colon);
    wantPort = std::atoi(hca.c_str() + colon + 1);
    ECCL_CHECK_ARG(wantPort > 0 && wantPort < 256, "ECCL_IB_HCA='{}': the port after ':' must be 1 to 255", hca);
  }
  DeviceList devices;
  std::unique_ptr<Context> c(new Context());
  for (int d = 0; d < devices.count && !c->context_; ++d) {
    const char* name = verbs().get_device_name(devices.list[d]);
    if (!wantName.empty() && wantName != name) continue;
    ibv_context* context = verbs().open_device(devices.list[d]);
    if (!context) continue;
    ibv_device_attr attr{};
    uint8_t chosen = 0;
    ibv_port_attr chosenAttr{};
    if (verbs().query_device(context, &attr) == 0)
      for (uint8_t p = 1; p <= attr.phys_port_cnt && !chosen; ++p) {
        ibv_port_attr pa{};
        if (wantPort && p != wantPort) continue;
        if (verbs().queryPort(context, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) chosen = p, chosenAttr = pa;
      }
    if (!chosen) {
      verbs().close_device(context);
      continue;
    }
    c->context_ = context;
    c->name_ = name;
    c->port_ = chosen;
    c->lid_ = chosenAttr.lid;
    c->mtu_ = chosenAttr.active_mtu;
    c->ethernet_ = chosenAttr.link_layer == IBV_LINK_LAYER_ETHERNET;
    if (gidIndex >= chosenAttr.gid_tbl_len)
      fail(ecclInvalidArgument, "ECCL_IB_GID_INDEX={}: {} port {} has {} GIDs", gidIndex, name, chosen,
           chosenAttr.gid_tbl_len);
    c->gidIndex_ = gidIndex >= 0 ? gidIndex : chooseGid(context, chosen, chosenAttr.gid_tbl_len);
  }
  if (!c->context_)
    fail(ecclSystemError, "no usable RDMA device{}: {}",
         hca.empty() ? " (none has an ACTIVE port)" : fmt::format(" named '{}' with an ACTIVE port", hca),
         describeDevices());
  ibv_gid_entry e{};
  if (verbs().queryGid(c->context_, c->port_, static_cast<uint32_t>(c->gidIndex_), &e) != 0)
    fail(ecclSystemError, "{} port {}: GID {} cannot be read: {}", c->name_, c->port_, c->gidIndex_, strerror(errno));
  c->gid_ = e.gid;
  c->gidText_ = fmt::format("{}, {}", gidText(e.gid), gidTypeName(e.gid_type));
  c->pd_ = verbs().alloc_pd(c->context_);
  if (!c->pd_) fail(ecclSystemError, "{}: ibv_alloc_pd: {}", c->name_, strerror(errno));
  int flags = fcntl(c->context_->async_fd, F_GETFL);
  if (flags < 0 || fcntl(c->context_->async_fd, F_SETFL, flags | O_NONBLOCK) != 0)
    fail(ecclSystemError, "{}: making the async event channel non-blocking: {}", c->name_, strerror(errno));
  log::info("ibverbs: {}", c->describe());
  return c;
}

Context::~Context() {
  if (pd_) verbs().dealloc_pd(pd_);
  if (context_) verbs().close_device(context_);
}

void Context::readAsyncEvents() {
  ibv_async_event event;
  while (verbs().get_async_event(context_, &event) == 0) {
    const char* what = verbs().event_type_str(event.event_type);
    {
      MutexLock lock(asyncMu_);
      switch (event.event_type) {
        case IBV_EVENT_PORT_ERR:
          if (event.element.port_num == port_)
            portFailure_ = fmt::format("{} port {} went down ({})", name_, port_, what);
          break;
        case IBV_EVENT_PORT_ACTIVE:
          // Lanes that failed stay failed; new ones may work again.
          if (event.element.port_num == port_) portFailure_.clear();
          break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
          queuePairFailures_[event.element.qp->qp_num] =
              fmt::format("{} reported queue pair {} in error ({})", name_, event.element.qp->qp_num, what);
          break;
        case IBV_EVENT_DEVICE_FATAL:
          portFailure_ = fmt::format("{} failed ({})", name_, what);
          break;
        default:
          break;
      }
    }
    log::warn("ibverbs: {}: asynchronous event: {}", name_, what);
    verbs().ack_async_event(&event);
  }
}

std::string Context::failureOf(uint32_t qpn) const {
  MutexLock lock(asyncMu_);
  if (!portFailure_.empty()) return portFailure_;
  auto it = queuePairFailures_.find(qpn);
  return it == queuePairFailures_.end() ? std::string() : it->second;
}

std::string Context::describe() const {
  return fmt::format("{} port {} GID {} ({}), MTU {}", name_, port_, gidIndex_, gidText_, 128 << mtu_);
}

}  // namespace eccl::transport::ibverbs
