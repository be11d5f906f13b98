#include "transport/ibverbs/library.h"

#include <dlfcn.h>

#include <cstring>
#include <string>

#include "common/error.h"

namespace eccl::transport::ibverbs {
namespace {

struct Loaded {
  Verbs verbs{};
  std::string problem;  // empty once loaded
};

Loaded load() {
  Loaded out;
  const char* file = "libibverbs.so.1";
  void* handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    out.problem = fmt::format("{} cannot be loaded ({}): install rdma-core's libibverbs1", file, dlerror());
    return out;
  }
  Verbs& v = out.verbs;
  auto bind = [&](auto& slot, const char* name) {
    if (!out.problem.empty()) return;
    void* symbol = dlsym(handle, name);
    if (!symbol) out.problem = fmt::format("{} lacks {} (rdma-core too old?)", file, name);
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  bind(v.get_device_list, "ibv_get_device_list");
  bind(v.free_device_list, "ibv_free_device_list");
  bind(v.get_device_name, "ibv_get_device_name");
  bind(v.open_device, "ibv_open_device");
  bind(v.close_device, "ibv_close_device");
  bind(v.query_device, "ibv_query_device");
  bind(v.query_gid_ex, "_ibv_query_gid_ex");
  bind(v.alloc_pd, "ibv_alloc_pd");
  bind(v.dealloc_pd, "ibv_dealloc_pd");
  bind(v.create_comp_channel, "ibv_create_comp_channel");
  bind(v.destroy_comp_channel, "ibv_destroy_comp_channel");
  bind(v.create_cq, "ibv_create_cq");
  bind(v.destroy_cq, "ibv_destroy_cq");
  bind(v.get_cq_event, "ibv_get_cq_event");
  bind(v.ack_cq_events, "ibv_ack_cq_events");
  bind(v.create_qp, "ibv_create_qp");
  bind(v.modify_qp, "ibv_modify_qp");
  bind(v.query_qp, "ibv_query_qp");
  bind(v.destroy_qp, "ibv_destroy_qp");
  bind(v.reg_mr, "ibv_reg_mr");
  bind(v.dereg_mr, "ibv_dereg_mr");
  bind(v.get_async_event, "ibv_get_async_event");
  bind(v.ack_async_event, "ibv_ack_async_event");
  bind(v.event_type_str, "ibv_event_type_str");
  bind(v.wc_status_str, "ibv_wc_status_str");
  bind(v.port_state_str, "ibv_port_state_str");
  bind(v.query_port_compat, "ibv_query_port");
  // Never unloaded: providers it loaded keep threads and callbacks in it.
  return out;
}

}  // namespace

int Verbs::queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
  if (verbs_context* extended = verbs_get_ctx_op(context, query_port))
    return extended->query_port(context, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

const Verbs& verbs() {
  static const Loaded loaded = load();
  if (!loaded.problem.empty()) fail(ecclSystemError, "ibverbs: {}", loaded.problem);
  return loaded.verbs;
}

}  // namespace eccl::transport::ibverbs
