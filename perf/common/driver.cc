#include "perf/common/driver.h"

#include "cli/cli.h"
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "coll/reduce.h"

namespace eccl::perf {
namespace {

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kReduce: return "reduce";
    case Kind::kAllToAll: return "alltoall";
    case Kind::kSendRecv: return "sendrecv";
  }
  return "?";
}

bool hasOp(Kind k) { return k == Kind::kAllReduce || k == Kind::kReduceScatter || k == Kind::kReduce; }
bool hasRoot(Kind k) { return k == Kind::kBroadcast || k == Kind::kReduce; }

// nccl-tests' bus bandwidth factors.
double busFactor(Kind k, int n) {
  switch (k) {
    case Kind::kAllReduce: return 2.0 * (n - 1) / n;
    case Kind::kAllGather: case Kind::kReduceScatter: case Kind::kAllToAll: return double(n - 1) / n;
    default: return 1.0;
  }
}

ecclDataType_t parseType(const std::string& s) {
  static const std::pair<const char*, ecclDataType_t> names[] = {
      {"int8", ecclInt8}, {"uint8", ecclUint8}, {"int32", ecclInt32}, {"int", ecclInt32}, {"uint32", ecclUint32},
      {"int64", ecclInt64}, {"uint64", ecclUint64}, {"half", ecclFloat16}, {"float16", ecclFloat16},
      {"float", ecclFloat32}, {"float32", ecclFloat32}, {"double", ecclFloat64}, {"float64", ecclFloat64},
      {"bfloat16", ecclBfloat16}};
  for (auto& [n, t] : names)
    if (s == n) return t;
  fprintf(stderr, "unknown data type '%s'\n", s.c_str());
  exit(2);
}

std::vector<ecclRedOp_t> parseOps(const std::string& s) {
  if (s == "all") return {ecclSum, ecclProd, ecclMax, ecclMin, ecclAvg};
  for (int o = 0; o < ecclNumOps; ++o)
    if (s == coll::opName(static_cast<ecclRedOp_t>(o))) return {static_cast<ecclRedOp_t>(o)};
  fprintf(stderr, "unknown reduction op '%s'\n", s.c_str());
  exit(2);
}

size_t parseSize(const std::string& s) {
  char* end;
  double v = strtod(s.c_str(), &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  }
  return static_cast<size_t>(v);
}

// Input element i of rank r, chosen so sums, products, minima and maxima of
// up to 64 ranks are exact in every type, including float16.
double inputValue(Kind k, ecclRedOp_t op, int r, size_t i) {
  if (op == ecclProd) return (i % 13 == 0 && (r + i) % 2 == 0) ? 2.0 : 1.0;
  if (k == Kind::kAllGather || k == Kind::kBroadcast || k == Kind::kAllToAll || k == Kind::kSendRecv)
    return double((r * 7 + i * 3) % 31);
  return double((r * 5 + i) % 7);
}

void setValue(void* buf, ecclDataType_t t, size_t i, double v) {
  switch (t) {
    case ecclInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case ecclUint8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case ecclInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case ecclUint32: static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v); break;
    case ecclInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case ecclUint64: static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v); break;
    case ecclFloat16: static_cast<uint16_t*>(buf)[i] = coll::floatToHalf(static_cast<float>(v)); break;
    case ecclBfloat16: static_cast<uint16_t*>(buf)[i] = coll::floatToBfloat16(static_cast<float>(v)); break;
    case ecclFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case ecclFloat64: static_cast<double*>(buf)[i] = v; break;
    default: break;
  }
}

double getValue(const void* buf, ecclDataType_t t, size_t i) {
  switch (t) {
    case ecclInt8: return static_cast<const int8_t*>(buf)[i];
    case ecclUint8: return static_cast<const uint8_t*>(buf)[i];
    case ecclInt32: return static_cast<const int32_t*>(buf)[i];
    case ecclUint32: return static_cast<const uint32_t*>(buf)[i];
    case ecclInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case ecclUint64: return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case ecclFloat16: return coll::halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case ecclBfloat16: return coll::bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case ecclFloat32: return static_cast<const float*>(buf)[i];
    case ecclFloat64: return static_cast<const double*>(buf)[i];
    default: return 0;
  }
}

double combine(ecclRedOp_t op, Kind k, int n, size_t i, size_t elementOffset) {
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    double v = inputValue(k, op, r, elementOffset + i);
    if (r == 0) acc = v;
    else if (op == ecclSum || op == ecclAvg) acc += v;
    else if (op == ecclProd) acc *= v;
    else if (op == ecclMax) acc = std::max(acc, v);
    else acc = std::min(acc, v);
  }
  return acc;
}

struct Layout {
  size_t count;           // the count argument
  size_t inElems, outElems;
};

Layout layoutFor(Kind k, size_t bytes, size_t es, int n) {
  size_t total = bytes / es;  // the "size" column is the whole buffer
  switch (k) {
    case Kind::kAllGather: return {total / n, total / n, (total / n) * n};
    case Kind::kReduceScatter: return {total / n, (total / n) * n, total / n};
    case Kind::kAllToAll: return {total / n, (total / n) * n, (total / n) * n};
    default: return {total, total, total};
  }
}

void fillInput(Kind k, ecclRedOp_t op, ecclDataType_t t, int r, void* in, size_t elems) {
  for (size_t i = 0; i < elems; ++i) setValue(in, t, i, inputValue(k, op, r, i));
}

// Counts wrong elements of this rank's output.
long checkOutput(Kind k, ecclRedOp_t op, ecclDataType_t t, int r, int n, int root, const void* out,
                 const Layout& L) {
  long wrong = 0;
  const bool integer = !(t == ecclFloat16 || t == ecclBfloat16 || t == ecclFloat32 || t == ecclFloat64);
  auto expectClose = [&](double got, double want) {
    if (integer || op != ecclAvg) return got == want;
    return std::fabs(got - want) <= 1e-2 * std::max(1.0, std::fabs(want));
  };
  for (size_t i = 0; i < L.outElems; ++i) {
    double want;
    switch (k) {
      case Kind::kAllReduce:
        want = combine(op, k, n, i, 0);
        if (op == ecclAvg) want = integer ? std::trunc(want / n) : want / n;
        break;
      case Kind::kReduce:
        if (r != root) return 0;
        want = combine(op, k, n, i, 0);
        if (op == ecclAvg) want = integer ? std::trunc(want / n) : want / n;
        break;
      case Kind::kReduceScatter:
        want = combine(op, k, n, i, r * L.count);
        if (op == ecclAvg) want = integer ? std::trunc(want / n) : want / n;
        break;
      case Kind::kAllGather: want = inputValue(k, op, static_cast<int>(i / L.count), i % L.count); break;
      case Kind::kBroadcast: want = inputValue(k, op, root, i); break;
      case Kind::kAllToAll: {
        int from = static_cast<int>(i / L.count);
        want = inputValue(k, op, from, r * L.count + i % L.count);
        break;
      }
      case Kind::kSendRecv: want = inputValue(k, op, (r - 1 + n) % n, i); break;
    }
    if (!expectClose(getValue(out, t, i), want)) ++wrong;
  }
  return wrong;
}

}  // namespace

Options parseOptions(int argc, char** argv, const std::string& program) {
  Options o;
  std::string b = "32M", e = "32M", i = "1M";
  eccl::cli::App app{program + ": nccl-tests compatible benchmark"};
  app.option("-b,--minbytes", b, "minimum size (B, K, M, G)");
  app.option("-e,--maxbytes", e, "maximum size");
  app.option("-i,--stepbytes", i, "increment between sizes (when -f is 1)");
  app.option("-f,--stepfactor", o.stepFactor, "multiplication factor between sizes");
  app.option("-n,--iters", o.iters, "timed iterations");
  app.option("-w,--warmup_iters", o.warmup, "warm-up iterations");
  app.option("-c,--check", o.check, "check results (0/1)");
  app.option("-o,--op", o.op, "sum, prod, max, min, avg or all");
  app.option("-d,--datatype", o.type, "int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double");
  app.option("-z,--blocking", o.blocking, "blocking collectives (host calls always block)");
  app.option("-r,--root", o.root, "root rank for broadcast and reduce");
  app.flag("--json", o.json, "print one JSON object per size instead of the table");
  app.flag("--log", o.log, "eccl: log every point-to-point send (boundary-send log, truncated each iteration)");
  if (int status = app.parse(argc, argv); status >= 0) exit(status);
  o.minBytes = parseSize(b);
  o.maxBytes = parseSize(e);
  o.stepBytes = parseSize(i);
  if (o.minBytes > o.maxBytes || o.iters < 1 || o.warmup < 0 || o.stepFactor < 1 ||
      (o.stepFactor == 1 && o.stepBytes == 0)) {
    fprintf(stderr, "%s: invalid sizes or iteration counts\n", program.c_str());
    exit(2);
  }
  return o;
}

long runSweep(Backend& be, Kind k, const Options& o) {
  const int n = be.size(), r = be.rank();
  const ecclDataType_t t = parseType(o.type);
  const size_t es = coll::typeSize(t);
  const auto ops = hasOp(k) ? parseOps(o.op) : std::vector<ecclRedOp_t>{ecclSum};
  const int root = hasRoot(k) ? o.root : -1;
  if (hasRoot(k) && (o.root < 0 || o.root >= n)) {
    if (r == 0) fprintf(stderr, "root %d is outside [0, %d)\n", o.root, n);
    exit(2);
  }
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  if (r == 0 && !o.json) {
    printf("# %s_perf (%s): nranks %d minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d "
           "validation: %d\n#\n# Using host memory on %s\n#\n",
           kindName(k), be.name().c_str(), n, o.minBytes, o.maxBytes,
           o.stepFactor > 1 ? o.stepFactor : double(o.stepBytes), o.stepFactor > 1 ? "factor" : "bytes", o.warmup,
           o.iters, o.check, host);
    printf("#%75s%36s\n", "out-of-place", "in-place");
    printf("#%11s%14s%10s%8s%8s%10s%9s%9s%7s%10s%9s%9s%7s\n", "size", "count", "type", "redop", "root", "time",
           "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("#%11s%14s%10s%8s%8s%10s%9s%9s%7s%10s%9s%9s%7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
           "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
  }
  long totalWrong = 0;
  bool firstMeasurement = true;
  double busSum = 0;
  int busCount = 0;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes;
       bytes = o.stepFactor > 1 ? std::max(bytes + 1, size_t(bytes * o.stepFactor)) : bytes + o.stepBytes) {
    Layout L = layoutFor(k, bytes, es, n);
    size_t shownBytes = (k == Kind::kAllGather || k == Kind::kReduceScatter || k == Kind::kAllToAll)
                            ? L.count * n * es
                            : L.count * es;
    for (ecclRedOp_t op : ops) {
      if (!be.supports(t, op)) continue;
      std::vector<uint8_t> in(std::max<size_t>(L.inElems * es, 1)), out(std::max<size_t>(L.outElems * es, 1));
      double timeUs[2], wrongs[2];
      for (int inplace = 0; inplace < 2; ++inplace) {
        if (inplace && (k == Kind::kAllToAll || k == Kind::kSendRecv)) {
          timeUs[1] = -1, wrongs[1] = -1;  // NCCL has no in-place form of these either
          continue;
        }
        // In-place: allgather's input is this rank's slice of the output,
        // reduce-scatter's output is this rank's slice of the input.
        void* outPtr = out.data();
        const void* inPtr = in.data();
        std::vector<uint8_t>& buf = (k == Kind::kReduceScatter) ? in : out;
        if (inplace) {
          if (k == Kind::kAllGather) inPtr = out.data() + r * L.count * es;
          else if (k == Kind::kReduceScatter) outPtr = in.data() + r * L.count * es;
          else inPtr = out.data();
        }
        auto prepare = [&] {
          if (inplace && k == Kind::kAllGather) fillInput(k, ecclSum, t, r, const_cast<void*>(inPtr), L.count);
          else if (inplace && k != Kind::kReduceScatter) fillInput(k, op, t, r, buf.data(), L.inElems);
          else fillInput(k, op, t, r, in.data(), L.inElems);
        };
        prepare();
        auto warmStart = std::chrono::steady_clock::now();
        for (int w = 0; w < o.warmup; ++w) be.run(k, inPtr, outPtr, L.count, t, op, root);
        if (firstMeasurement && o.warmup > 0) {
          // Freshly started ranks share cores until the scheduler spreads
          // them, which takes longer than a few hundred tiny ops; warm up
          // the first size for about kSettleUs. The count comes from an
          // average over ranks, so every rank runs the same number.
          constexpr double kSettleUs = 200000;
          double perOp = be.averageOverRanks(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - warmStart).count() /
              o.warmup);
          long extra = std::min<long>(100000, static_cast<long>(kSettleUs / std::max(perOp, 1.0)));
          for (long w = 0; w < extra; ++w) be.run(k, inPtr, outPtr, L.count, t, op, root);
          firstMeasurement = false;
        }
        be.barrier();
        auto start = std::chrono::steady_clock::now();
        for (int it = 0; it < o.iters; ++it) be.run(k, inPtr, outPtr, L.count, t, op, root);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                    o.iters;
        timeUs[inplace] = be.averageOverRanks(us);
        long wrong = 0;
        if (o.check) {
          prepare();
          be.run(k, inPtr, outPtr, L.count, t, op, root);
          wrong = checkOutput(k, op, t, r, n, root, outPtr, L);
        }
        wrongs[inplace] = be.maxOverRanks(static_cast<double>(wrong));
        totalWrong += static_cast<long>(wrongs[inplace]);
      }
      double algbw = shownBytes / (timeUs[0] * 1e3), busbw = algbw * busFactor(k, n);
      busSum += busbw, ++busCount;
      if (r != 0) continue;
      if (o.json) {
        nlohmann::json j = {{"collective", kindName(k)}, {"library", be.name()}, {"nranks", n},
                            {"size", shownBytes}, {"count", L.count}, {"type", o.type},
                            {"redop", hasOp(k) ? coll::opName(op) : "none"}, {"root", root},
                            {"time_us", timeUs[0]}, {"algbw", algbw}, {"busbw", busbw},
                            {"wrong", wrongs[0]}};
        if (timeUs[1] >= 0) {
          double a2 = shownBytes / (timeUs[1] * 1e3);
          j["inplace_time_us"] = timeUs[1];
          j["inplace_busbw"] = a2 * busFactor(k, n);
          j["inplace_wrong"] = wrongs[1];
        }
        printf("%s\n", j.dump().c_str());
      } else {
        printf("%12zu%14zu%10s%8s%8d%10.2f%9.2f%9.2f%7s", shownBytes, L.count, o.type.c_str(),
               hasOp(k) ? coll::opName(op) : "none", root, timeUs[0], algbw, busbw,
               o.check ? std::to_string(static_cast<long>(wrongs[0])).c_str() : "N/A");
        if (timeUs[1] >= 0) {
          double a2 = shownBytes / (timeUs[1] * 1e3);
          printf("%10.2f%9.2f%9.2f%7s\n", timeUs[1], a2, a2 * busFactor(k, n),
                 o.check ? std::to_string(static_cast<long>(wrongs[1])).c_str() : "N/A");
        } else {
          printf("%10s%9s%9s%7s\n", "N/A", "N/A", "N/A", "N/A");
        }
      }
      fflush(stdout);
    }
    if (o.stepFactor <= 1 && o.stepBytes == 0) break;
  }
  if (r == 0 && !o.json) {
    printf("# Out of bounds values : %ld %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", busCount ? busSum / busCount : 0.0);
  }
  return totalWrong;
}

EcclRunJob ecclRunJob(const std::string& program) {
  const char* rank = getenv("ECCL_RANK");
  const char* size = getenv("ECCL_NRANKS");
  const char* id = getenv("ECCL_UNIQUE_ID");
  if (!rank || !size || !id || strlen(id) <= 56) {
    fprintf(stderr, "%s: run under eccl-run (ECCL_RANK, ECCL_NRANKS, ECCL_UNIQUE_ID)\n", program.c_str());
    exit(2);
  }
  return {atoi(rank), atoi(size), std::string(id).substr(56, 16)};
}

}  // namespace eccl::perf
