// Copy bandwidth by distance between the buffers modulo a 4 KiB page:
// glibc's memcpy against eccl's copyBytes, and process_vm_readv straight
// and through PeerMemory (which bounces the slow distances). Shows the
// `rep movsb` aliasing penalty copyBytes and PeerMemory avoid, on this
// machine's CPU and kernel. Medians of --runs alternating runs.
//   copy_perf [--runs 5]
#include <unistd.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/copy.h"
#include "transport/peer_memory.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GB/s of `copy` moving `bytes`, repeated over about 50 ms.
double bandwidth(size_t bytes, const std::function<void()>& copy) {
  const size_t reps = std::max<size_t>(5, (size_t{2} << 30) / bytes / 20);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < reps; ++i) copy();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) * reps / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
  const size_t arenaBytes = size_t{16} << 20;
  auto* arena = static_cast<uint8_t*>(std::aligned_alloc(4096, arenaBytes));
  std::memset(arena, 1, arenaBytes);
  const eccl::transport::PeerMemory self(getpid());  // this process as its own peer: the kernel copies alike
  std::printf("# copy bandwidth GB/s by (dst - src) mod 4096, median of %d alternating runs\n", runs);
  std::printf("%10s %6s %10s %10s %12s %12s\n", "size", "apart", "memcpy", "copyBytes", "vm_readv", "PeerMemory");
  for (size_t bytes : {size_t{4} << 10, size_t{16} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20,
                       size_t{4} << 20})
    for (size_t apart : {size_t{0}, size_t{16}, size_t{32}, size_t{64}}) {
      uint8_t* src = arena + 4096 + 48;
      uint8_t* dst = arena + (size_t{8} << 20) + ((48 + apart) & 4095);
      std::vector<double> got[4];
      for (int r = 0; r < runs; ++r) {
        got[0].push_back(bandwidth(bytes, [&] { std::memcpy(dst, src, bytes); asm volatile("" ::: "memory"); }));
        got[1].push_back(bandwidth(bytes, [&] { eccl::copyBytes(dst, src, bytes); asm volatile("" ::: "memory"); }));
        got[2].push_back(bandwidth(bytes, [&] {
          iovec mine{dst, bytes}, theirs{src, bytes};
          if (process_vm_readv(getpid(), &mine, 1, &theirs, 1, 0) != static_cast<ssize_t>(bytes)) std::abort();
        }));
        got[3].push_back(bandwidth(bytes, [&] {
          if (!self.read(reinterpret_cast<uint64_t>(src), dst, bytes, nullptr)) std::abort();
        }));
      }
      std::printf("%10zu %6zu %10.1f %10.1f %12.1f %12.1f\n", bytes, apart, median(got[0]), median(got[1]),
                  median(got[2]), median(got[3]));
    }
  std::free(arena);
  return 0;
}
