#include "streams.h"

#ifdef TORCH_ECCL_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torch_eccl {
namespace {
thread_local ecclStream_t t_stream = nullptr;
}

bool cudaBuild() {
#ifdef TORCH_ECCL_CUDA
  return true;
#else
  return false;
#endif
}

ecclStream_t opStream() { return t_stream; }

std::function<void()> onCallerStream(const std::vector<at::Tensor>& tensors, std::function<void()> run) {
#ifdef TORCH_ECCL_CUDA
  for (const auto& t : tensors) {
    if (!t.defined() || !t.is_cuda()) continue;
    c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(t.device().index());
    return [stream, run = std::move(run)] {
      c10::cuda::CUDAStreamGuard guard(stream);
      ecclStream_t saved = t_stream;
      t_stream = stream.stream();
      try {
        run();
      } catch (...) {
        t_stream = saved;
        throw;
      }
      t_stream = saved;
    };
  }
#else
  (void)tensors;
#endif
  return run;
}

}  // namespace torch_eccl
