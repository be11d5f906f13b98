// The reconfigure handle: a member's identity as c10d's reconfigure API
// passes it between processes, as JSON text:
//   {"eccl_member": "<16 hex digits>", "job": "<16 hex digits>", "rank": R, "epoch": E}
// job is a tag of the job's unique id (not its secret); rank and epoch say
// where the member stood when it made the handle (-1: a standby).
#pragma once

#include <cstdint>
#include <string>

namespace torch_eccl {

struct HandleInfo {
  uint64_t member = 0;
  uint64_t job = 0;
  int rank = -1;
  uint32_t epoch = 0;
};

std::string makeHandle(const HandleInfo& info);
HandleInfo parseHandle(const std::string& handle);  // raises ValueError naming what is wrong
uint64_t jobTag(const std::string& uniqueIdText);

}  // namespace torch_eccl
