// libibverbs, loaded with dlopen at its first use rather than linked: an
// eccl built with rdma-core still loads and runs on a machine without it
// (the ib back end is then left out, saying why), as NCCL's IB transport
// does. The entry points verbs.h defines inline (posting, polling, arming a
// completion queue) call through the device's own function table and need
// nothing from here.
#pragma once

#include <infiniband/verbs.h>

namespace eccl::transport::ibverbs {

struct Verbs {
  decltype(&::ibv_get_device_list) get_device_list;
  decltype(&::ibv_free_device_list) free_device_list;
  decltype(&::ibv_get_device_name) get_device_name;
  decltype(&::ibv_open_device) open_device;
  decltype(&::ibv_close_device) close_device;
  decltype(&::ibv_query_device) query_device;
  decltype(&::_ibv_query_gid_ex) query_gid_ex;
  decltype(&::ibv_alloc_pd) alloc_pd;
  decltype(&::ibv_dealloc_pd) dealloc_pd;
  decltype(&::ibv_create_comp_channel) create_comp_channel;
  decltype(&::ibv_destroy_comp_channel) destroy_comp_channel;
  decltype(&::ibv_create_cq) create_cq;
  decltype(&::ibv_destroy_cq) destroy_cq;
  decltype(&::ibv_get_cq_event) get_cq_event;
  decltype(&::ibv_ack_cq_events) ack_cq_events;
  decltype(&::ibv_create_qp) create_qp;
  decltype(&::ibv_modify_qp) modify_qp;
  decltype(&::ibv_query_qp) query_qp;
  decltype(&::ibv_destroy_qp) destroy_qp;
  decltype(&::ibv_reg_mr) reg_mr;
  decltype(&::ibv_dereg_mr) dereg_mr;
  decltype(&::ibv_get_async_event) get_async_event;
  decltype(&::ibv_ack_async_event) ack_async_event;
  decltype(&::ibv_event_type_str) event_type_str;
  decltype(&::ibv_wc_status_str) wc_status_str;
  decltype(&::ibv_port_state_str) port_state_str;
  decltype(&::ibv_query_port) query_port_compat;

  // verbs.h's ibv_query_port: the provider's extended query where it has
  // one, the library's original entry point otherwise.
  int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const;
  int queryGid(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry) const {
    return query_gid_ex(context, port, index, entry, 0, sizeof(*entry));
  }
};

// The loaded library; throws ecclSystemError naming the file and the
// loader's reason when it cannot be loaded or lacks an entry point.
const Verbs& verbs();

}  // namespace eccl::transport::ibverbs
