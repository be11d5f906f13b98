#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "common/error.h"
#include "transport/ibverbs/library.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {

CompletionQueue::CompletionQueue(Context& context, int entries) : context_(context) {
  channel_ = verbs().create_comp_channel(context.raw());
  if (!channel_) fail(ecclSystemError, "{}: ibv_create_comp_channel: {}", context.name(), strerror(errno));
  // The progress thread polls the descriptor with everything else it waits on.
  int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    fail(ecclSystemError, "{}: the completion channel cannot be made non-blocking: {}", context.name(), strerror(errno));
  cq_ = verbs().create_cq(context.raw(), entries, nullptr, channel_, 0);
  if (!cq_) {
    verbs().destroy_comp_channel(channel_);
    fail(ecclSystemError, "{}: ibv_create_cq({} entries): {}", context.name(), entries, strerror(errno));
  }
  context_.completionQueuesOpen_.fetch_add(1, std::memory_order_relaxed);
}

CompletionQueue::~CompletionQueue() {
  context_.completionQueuesOpen_.fetch_sub(1, std::memory_order_relaxed);
  verbs().destroy_cq(cq_);
  verbs().destroy_comp_channel(channel_);
}

int CompletionQueue::fd() const { return channel_->fd; }

void CompletionQueue::arm() {
  if (ibv_req_notify_cq(cq_, 0) != 0) fail(ecclSystemError, "ibv_req_notify_cq: {}", strerror(errno));
}

void CompletionQueue::consumeEvent() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (verbs().get_cq_event(channel_, &cq, &context) == 0) verbs().ack_cq_events(cq, 1);
}

int CompletionQueue::poll(ibv_wc* out, int max) {
  int n = ibv_poll_cq(cq_, max, out);
  if (n < 0) fail(ecclSystemError, "ibv_poll_cq failed");
  return n;
}

ibv_wc CompletionQueue::waitOne(Deadline deadline, const std::string& what) {
  ibv_wc wc{};
  for (;;) {
    if (poll(&wc, 1) == 1) return wc;
    arm();
    if (poll(&wc, 1) == 1) return wc;  // came between the poll and the arm
    int64_t left = msUntil(deadline);
    if (left <= 0) fail(ecclTimeout, "{}: no completion before the deadline", what);
    pollfd p{fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100))) > 0) consumeEvent();
  }
}

QueuePair::QueuePair(Context& context, CompletionQueue& send, CompletionQueue& recv, const Limits& limits)
    : context_(context) {
  ibv_qp_init_attr init{};
  init.send_cq = send.raw();
  init.recv_cq = recv.raw();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = limits.sendDepth;
  init.cap.max_recv_wr = limits.recvDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = limits.inlineBytes;
  qp_ = verbs().create_qp(context.pd(), &init);
  if (!qp_) fail(ecclSystemError, "{}: ibv_create_qp (RC, {} sends, {} receives): {}", context.name(),
                 limits.sendDepth, limits.recvDepth, strerror(errno));
  inline_ = init.cap.max_inline_data;
  psn_ = std::random_device{}() & 0xffffff;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = context.port();
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (int rc = verbs().modify_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    verbs().destroy_qp(qp_);
    fail(ecclSystemError, "{}: queue pair to INIT: {}", context.name(), strerror(rc));
  }
  context_.queuePairsCreated_.fetch_add(1, std::memory_order_relaxed);
}

QueuePair::~QueuePair() {
  verbs().destroy_qp(qp_);
  context_.queuePairsDestroyed_.fetch_add(1, std::memory_order_relaxed);
}

Endpoint QueuePair::endpoint() const {
  Endpoint e;
  e.qpn = qp_->qp_num;
  e.psn = psn_;
  e.lid = context_.lid();
  e.mtu = static_cast<uint8_t>(context_.activeMtu());
  e.gid = context_.gid();
  return e;
}

void QueuePair::connect(const Endpoint& remote) {
  ECCL_CHECK_ARG(remote.qpn != 0 && remote.mtu >= IBV_MTU_256 && remote.mtu <= IBV_MTU_4096,
                 "queue pair {}: a malformed peer endpoint (QP {}, MTU code {})", qp_->qp_num, remote.qpn, remote.mtu);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(context_.activeMtu(), static_cast<ibv_mtu>(remote.mtu));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn & 0xffffff;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = context_.port();
  if (context_.ethernet()) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = remote.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(context_.gidIndex());
    attr.ah_attr.grh.hop_limit = 64;
  } else {
    attr.ah_attr.dlid = remote.lid;
  }
  if (int rc = verbs().modify_qp(qp_, &attr,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    fail(ecclSystemError, "queue pair {} to RTR against QP {}: {}", qp_->qp_num, remote.qpn, strerror(rc));
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;  // 4.096 us * 2^14, about 67 ms per try
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;  // a receiver short of posted receives is waited for
  attr.sq_psn = psn_;
  attr.max_rd_atomic = 1;
  if (int rc = verbs().modify_qp(qp_, &attr,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC))
    fail(ecclSystemError, "queue pair {} to RTS: {}", qp_->qp_num, strerror(rc));
}

ibv_qp_state QueuePair::state() const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (verbs().query_qp(qp_, &attr, IBV_QP_STATE, &init) != 0) return IBV_QPS_ERR;
  return attr.qp_state;
}

void QueuePair::postRecv(uint64_t wrId, void* buffer, uint32_t bytes, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(buffer), bytes, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = bytes ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, &wr, &bad)) fail(ecclSystemError, "queue pair {}: post receive: {}", qp_->qp_num, strerror(rc));
}

namespace {

void postOne(ibv_qp* qp, ibv_send_wr& wr, ibv_sge& sge, uint32_t inlineLimit, bool signaled, const char* what) {
  wr.sg_list = &sge;
  wr.num_sge = sge.length ? 1 : 0;
  wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (sge.length <= inlineLimit ? IBV_SEND_INLINE : 0);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, &wr, &bad)) fail(ecclSystemError, "queue pair {}: post {}: {}", qp->qp_num, what, strerror(rc));
}

}  // namespace

void QueuePair::postWrite(uint64_t wrId, const void* local, uint32_t bytes, uint32_t lkey, uint64_t remote,
                          uint32_t rkey, std::optional<uint32_t> immediate, bool signaled) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), bytes, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.opcode = immediate ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  if (immediate) wr.imm_data = htonl(*immediate);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  postOne(qp_, wr, sge, inline_, signaled, "RDMA write");
}

void QueuePair::postSend(uint64_t wrId, const void* local, uint32_t bytes, uint32_t lkey, bool signaled) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), bytes, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.opcode = IBV_WR_SEND;
  postOne(qp_, wr, sge, inline_, signaled, "send");
}

}  // namespace eccl::transport::ibverbs
