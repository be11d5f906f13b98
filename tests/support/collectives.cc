#include "tests/support/collectives.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "coll/reduce.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

// Small integers: sums of up to 64 ranks stay exact in float32.
float value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 13) % 17); }

void ok(ecclResult_t r, ecclComm_t c, const char* what) {
  if (r != ecclSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + ecclGetErrorString(r) + ": " + ecclGetLastError(c));
}

}  // namespace

void checkEveryCollective(ecclComm_t comm, size_t count, bool inPlace) {
  int rank, n;
  ok(ecclCommUserRank(comm, &rank), comm, "rank");
  ok(ecclCommCount(comm, &n), comm, "count");
  std::string where = " (count " + std::to_string(count) + (inPlace ? ", in-place)" : ", out-of-place)");

  {  // allreduce, sum
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = value(rank, i);
    float* dst = inPlace ? in.data() : out.data();
    ok(ecclAllReduce(in.data(), dst, count, ecclFloat32, ecclSum, comm, nullptr), comm, "allreduce");
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i);
      RANK_CHECK(dst[i] == want, "allreduce element " + std::to_string(i) + where);
    }
  }
  for (int root : {0, n - 1}) {  // broadcast
    std::vector<int32_t> buf(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) buf[i] = rank == root ? static_cast<int32_t>(i * 3 + root) : -7;
    int32_t* dst = inPlace ? buf.data() : out.data();
    ok(ecclBroadcast(buf.data(), dst, count, ecclInt32, root, comm, nullptr), comm, "broadcast");
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(dst[i] == static_cast<int32_t>(i * 3 + root), "broadcast element " + std::to_string(i) + where);
  }
  for (int root : {0, n - 1}) {  // reduce, max
    std::vector<float> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = value(rank, i);
    float* dst = inPlace ? in.data() : out.data();
    ok(ecclReduce(in.data(), dst, count, ecclFloat32, ecclMax, root, comm, nullptr), comm, "reduce");
    if (rank == root)
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want = std::max(want, value(r, i));
        RANK_CHECK(dst[i] == want, "reduce element " + std::to_string(i) + where);
      }
  }
  {  // allgather
    std::vector<int32_t> in(count), out(count * n, -1);
    int32_t* src = inPlace ? out.data() + rank * count : in.data();
    for (size_t i = 0; i < count; ++i) src[i] = static_cast<int32_t>(rank * 1000003 + i);
    ok(ecclAllGather(src, out.data(), count, ecclInt32, comm, nullptr), comm, "allgather");
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(out[r * count + i] == static_cast<int32_t>(r * 1000003 + i),
                   "allgather block " + std::to_string(r) + " element " + std::to_string(i) + where);
  }
  {  // reduce-scatter, sum
    std::vector<float> in(count * n), out(count, -1);
    for (size_t i = 0; i < count * n; ++i) in[i] = value(rank, i);
    float* dst = inPlace ? in.data() + rank * count : out.data();
    ok(ecclReduceScatter(in.data(), dst, count, ecclFloat32, ecclSum, comm, nullptr), comm, "reducescatter");
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, rank * count + i);
      RANK_CHECK(dst[i] == want, "reducescatter element " + std::to_string(i) + where);
    }
  }
  if (!inPlace) {  // alltoall and alltoallv have no in-place form
    std::vector<int32_t> in(count * n), out(count * n, -1);
    for (int to = 0; to < n; ++to)
      for (size_t i = 0; i < count; ++i) in[to * count + i] = static_cast<int32_t>(rank * 100000 + to * 1000 + i % 1000);
    ok(ecclAllToAll(in.data(), out.data(), count, ecclInt32, comm, nullptr), comm, "alltoall");
    for (int from = 0; from < n; ++from)
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(out[from * count + i] == static_cast<int32_t>(from * 100000 + rank * 1000 + i % 1000),
                   "alltoall element " + std::to_string(i) + " from " + std::to_string(from) + where);
    // alltoallv: rank r sends (r + to) % 3 * count / 2 + 1 elements to `to`, packed, reversed order.
    auto amount = [&](int from, int to) { return static_cast<size_t>(((from + to) % 3) * (count / 2) + (to % 2)); };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t soff = 0, roff = 0;
    for (int p = n - 1; p >= 0; --p) sc[p] = amount(rank, p), sd[p] = soff, soff += sc[p];
    for (int p = 0; p < n; ++p) rc[p] = amount(p, rank), rd[p] = roff, roff += rc[p];
    std::vector<int32_t> vin(soff + 1), vout(roff + 1, -1);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < sc[p]; ++i) vin[sd[p] + i] = static_cast<int32_t>(rank * 7919 + p * 31 + i);
    ok(ecclAllToAllv(vin.data(), sc.data(), sd.data(), vout.data(), rc.data(), rd.data(), ecclInt32, comm, nullptr),
       comm, "alltoallv");
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < rc[p]; ++i)
        RANK_CHECK(vout[rd[p] + i] == static_cast<int32_t>(p * 7919 + rank * 31 + i),
                   "alltoallv element " + std::to_string(i) + " from " + std::to_string(p) + where);
  }
  {  // a ring of send/recv in one group must not deadlock
    std::vector<int64_t> out(count, -1), in(count);
    for (size_t i = 0; i < count; ++i) in[i] = rank * 1000000007LL + static_cast<int64_t>(i);
    ok(ecclGroupStart(), comm, "groupstart");
    ok(ecclSend(in.data(), count, ecclInt64, (rank + 1) % n, comm, nullptr), comm, "send");
    ok(ecclRecv(out.data(), count, ecclInt64, (rank - 1 + n) % n, comm, nullptr), comm, "recv");
    ok(ecclGroupEnd(), comm, "groupend");
    int from = (rank - 1 + n) % n;
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(out[i] == from * 1000000007LL + static_cast<int64_t>(i), "sendrecv element " + std::to_string(i) + where);
  }
  ok(ecclBarrier(comm), comm, "barrier");
}

void checkEveryTypeAndOp(ecclComm_t comm, size_t count) {
  int rank, n;
  ok(ecclCommUserRank(comm, &rank), comm, "rank");
  ok(ecclCommCount(comm, &n), comm, "count");
  for (int t = 0; t < ecclNumTypes; ++t) {
    auto type = static_cast<ecclDataType_t>(t);
    size_t es = coll::typeSize(type);
    for (int o = 0; o < ecclNumOps; ++o) {
      auto op = static_cast<ecclRedOp_t>(o);
      // Values small enough that every op is exact in every type (prod of n ones and twos).
      auto v = [&](int r, size_t i) -> double {
        if (op == ecclProd) return ((r + i) % 4 == 0) ? 2 : 1;
        return static_cast<double>((r * 3 + i * 5) % 9) + (type == ecclInt8 || type == ecclUint8 ? 0 : 0.5 * (i % 2));
      };
      std::vector<uint8_t> in(count * es), out(count * es);
      std::vector<double> want(count);
      for (size_t i = 0; i < count; ++i) {
        double x = v(rank, i);
        switch (type) {
          case ecclInt8: reinterpret_cast<int8_t*>(in.data())[i] = static_cast<int8_t>(x); break;
          case ecclUint8: in[i] = static_cast<uint8_t>(x); break;
          case ecclInt32: reinterpret_cast<int32_t*>(in.data())[i] = static_cast<int32_t>(x); break;
          case ecclUint32: reinterpret_cast<uint32_t*>(in.data())[i] = static_cast<uint32_t>(x); break;
          case ecclInt64: reinterpret_cast<int64_t*>(in.data())[i] = static_cast<int64_t>(x); break;
          case ecclUint64: reinterpret_cast<uint64_t*>(in.data())[i] = static_cast<uint64_t>(x); break;
          case ecclFloat16: reinterpret_cast<uint16_t*>(in.data())[i] = coll::floatToHalf(static_cast<float>(x)); break;
          case ecclBfloat16: reinterpret_cast<uint16_t*>(in.data())[i] = coll::floatToBfloat16(static_cast<float>(x)); break;
          case ecclFloat32: reinterpret_cast<float*>(in.data())[i] = static_cast<float>(x); break;
          case ecclFloat64: reinterpret_cast<double*>(in.data())[i] = x; break;
          default: break;
        }
        bool integer = type != ecclFloat16 && type != ecclBfloat16 && type != ecclFloat32 && type != ecclFloat64;
        double acc = 0;
        for (int r = 0; r < n; ++r) {
          double y = v(r, i);
          if (integer) y = std::trunc(y);
          if (r == 0) acc = y;
          else if (op == ecclSum || op == ecclAvg) acc += y;
          else if (op == ecclProd) acc *= y;
          else if (op == ecclMax) acc = std::max(acc, y);
          else acc = std::min(acc, y);
        }
        if (op == ecclAvg) acc = integer ? std::trunc(acc / n) : acc / n;
        want[i] = acc;
      }
      ok(ecclAllReduce(in.data(), out.data(), count, type, op, comm, nullptr), comm, "allreduce(type, op)");
      for (size_t i = 0; i < count; ++i) {
        double got;
        switch (type) {
          case ecclInt8: got = reinterpret_cast<int8_t*>(out.data())[i]; break;
          case ecclUint8: got = out[i]; break;
          case ecclInt32: got = reinterpret_cast<int32_t*>(out.data())[i]; break;
          case ecclUint32: got = reinterpret_cast<uint32_t*>(out.data())[i]; break;
          case ecclInt64: got = static_cast<double>(reinterpret_cast<int64_t*>(out.data())[i]); break;
          case ecclUint64: got = static_cast<double>(reinterpret_cast<uint64_t*>(out.data())[i]); break;
          case ecclFloat16: got = coll::halfToFloat(reinterpret_cast<uint16_t*>(out.data())[i]); break;
          case ecclBfloat16: got = coll::bfloat16ToFloat(reinterpret_cast<uint16_t*>(out.data())[i]); break;
          case ecclFloat32: got = reinterpret_cast<float*>(out.data())[i]; break;
          default: got = reinterpret_cast<double*>(out.data())[i]; break;
        }
        // The reference rounded once to the output type: what eccl must produce.
        double rounded = want[i];
        if (type == ecclFloat16) rounded = coll::halfToFloat(coll::floatToHalf(static_cast<float>(want[i])));
        if (type == ecclBfloat16) rounded = coll::bfloat16ToFloat(coll::floatToBfloat16(static_cast<float>(want[i])));
        if (type == ecclFloat32) rounded = static_cast<float>(want[i]);
        RANK_CHECK(got == rounded, std::string("allreduce ") + coll::typeName(type) + " " + coll::opName(op) +
                                       " element " + std::to_string(i) + ": got " + std::to_string(got) +
                                       " want " + std::to_string(rounded));
      }
    }
  }
}

}  // namespace eccl::test
