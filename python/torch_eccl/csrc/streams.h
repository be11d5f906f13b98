// CUDA tensors: which stream an op is ordered on. The caller's current
// stream is captured when the op is issued; while the op runs (on the
// driver thread or inline) that stream is current, so the staging copies
// torch makes and the eccl calls themselves are ordered on it, as NCCL's
// are. Without CUDA in the build every tensor must be on the CPU.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "eccl.h"

namespace torch_eccl {

// Whether this build takes CUDA tensors.
bool cudaBuild();
// The stream the running op is ordered on: NULL for CPU tensors.
ecclStream_t opStream();
// Wraps `run` so that it runs with the caller's current stream of the
// tensors' device (if they are CUDA tensors) current and as opStream().
std::function<void()> onCallerStream(const std::vector<at::Tensor>& tensors, std::function<void()> run);

}  // namespace torch_eccl
