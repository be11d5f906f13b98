#include "tensors.h"

#include "streams.h"

#include <c10/util/Exception.h>

namespace torch_eccl {

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), "eccl ", op, ": a tensor is undefined");
  TORCH_CHECK_VALUE(t.device().is_cpu() || (t.is_cuda() && cudaBuild()), "eccl ", op,
                    ": tensors must be on the CPU", cudaBuild() ? " or a CUDA device" : "", ", got one on ",
                    t.device(), cudaBuild() ? "" : " (this torch_eccl was built without CUDA)");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "eccl ", op, ": sparse tensors are not supported");
}

void checkTensors(const std::vector<at::Tensor>& ts, const char* op) {
  for (const auto& t : ts) checkTensor(t, op);
}

void checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK_VALUE(ts.size() == 1, "eccl ", op, ": takes exactly one tensor per process, got ", ts.size());
  checkTensor(ts[0], op);
}

void checkSameTypeAndShape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "eccl ", op, ": ", what, " has dtype ", b.scalar_type(),
                   ", expected ", a.scalar_type());
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), "eccl ", op, ": ", what, " has shape ", b.sizes(), ", expected ",
                    a.sizes());
}

ecclDataType_t reductionType(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return ecclFloat32;
    case at::kDouble: return ecclFloat64;
    case at::kHalf: return ecclFloat16;
    case at::kBFloat16: return ecclBfloat16;
    case at::kChar: return ecclInt8;
    case at::kByte: return ecclUint8;
    case at::kBool: return ecclUint8;
    case at::kInt: return ecclInt32;
    case at::kLong: return ecclInt64;
    case at::kUInt32: return ecclUint32;
    case at::kUInt64: return ecclUint64;
    case at::kComplexFloat: return ecclFloat32;
    case at::kComplexDouble: return ecclFloat64;
    default:
      TORCH_CHECK_TYPE(false, "eccl ", op, ": cannot reduce dtype ", t,
                       " (eccl reduces float16/32/64, bfloat16, int8/32/64, uint8/32/64, bool and complex64/128)");
  }
}

Reduction reduction(const c10d::ReduceOp& op, at::ScalarType type, const char* name) {
  const bool isBool = type == at::kBool, isComplex = at::isComplexType(type);
  const bool isFloat = at::isFloatingType(type) || isComplex;
  Reduction r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = isBool ? ecclMax : ecclSum; break;
    case c10d::ReduceOp::PRODUCT: r.op = isBool ? ecclMin : ecclProd; break;
    case c10d::ReduceOp::MIN: r.op = ecclMin; break;
    case c10d::ReduceOp::MAX: r.op = ecclMax; break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(!isBool, "eccl ", name, ": AVG of bool tensors is not defined");
      r.op = ecclAvg;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
      TORCH_CHECK_VALUE(isBool, "eccl ", name, ": bitwise ", op.op_ == c10d::ReduceOp::BAND ? "AND" : "OR",
                        " is supported on bool tensors only (eccl has no bitwise reductions), got ", type);
      r.op = op.op_ == c10d::ReduceOp::BAND ? ecclMin : ecclMax;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK_VALUE(isFloat, "eccl ", name, ": PREMUL_SUM needs a floating-point tensor, got ", type);
#if TORCH_ECCL_NCCL_PREMUL_NAME
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());  // its name before torch 2.1x
#else
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
#endif
      TORCH_CHECK_VALUE(s, "eccl ", name, ": PREMUL_SUM without its factor");
      if (s->tensor_factor.defined()) r.preScaleTensor = s->tensor_factor;
      else r.preScale = s->double_factor;
      r.op = ecclSum;
      break;
    }
    default:
      TORCH_CHECK_VALUE(false, "eccl ", name, ": reduce op ", static_cast<int>(op.op_),
                        " is not supported (eccl has sum, product, min, max, avg and premul-sum; "
                        "bitwise and/or on bool)");
  }
  TORCH_CHECK_VALUE(!isComplex || r.op == ecclSum || r.op == ecclAvg, "eccl ", name,
                    ": complex tensors reduce by SUM, AVG or PREMUL_SUM only");
  return r;
}

at::Tensor realView(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

Flat::Flat(const at::Tensor& t, bool copyIn) : original_(t) {
  at::Tensor real = realView(t);
  if (real.is_contiguous()) {
    buffer_ = real;
    return;
  }
  copy_ = true;
  buffer_ = copyIn ? real.contiguous() : at::empty(real.sizes(), real.options());
}

void Flat::writeBack() {
  if (copy_) realView(original_).copy_(buffer_);
}

}  // namespace torch_eccl
