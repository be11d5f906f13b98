// Tensors to eccl buffers: data types, reduction ops, argument checks and
// contiguous staging. Checks run on the caller's thread (a bad argument
// raises at the call); staging runs on the driver thread, in issue order.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>
#include <vector>

#include "eccl.h"

namespace torch_eccl {

// Every tensor a call is given lives on the CPU (device buffers come with
// the C API's stream support) and is dense.
void checkTensor(const at::Tensor& t, const char* op);
void checkTensors(const std::vector<at::Tensor>& ts, const char* op);
void checkSingle(const std::vector<at::Tensor>& ts, const char* op);
void checkSameTypeAndShape(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what);

// The eccl type that reduces this dtype; raises (TypeError) for types eccl
// cannot reduce. Complex tensors reduce as their real view (sum/avg only).
ecclDataType_t reductionType(at::ScalarType t, const char* op);

// A reduction op as eccl runs it on tensors of `type`: bool sum/product
// are logical or/and (max/min), bitwise and/or on bool likewise; premul
// sum scales a staged copy, then sums. Raises (ValueError) for the rest.
struct Reduction {
  ecclRedOp_t op = ecclSum;
  std::optional<double> preScale;         // PREMUL_SUM with a number
  std::optional<at::Tensor> preScaleTensor;  // PREMUL_SUM with a one-element tensor
};
Reduction reduction(const c10d::ReduceOp& op, at::ScalarType type, const char* name);

// A tensor as one flat buffer eccl reads or writes: the tensor itself when
// it is contiguous and real, else a contiguous (real-view) copy that
// writeBack() copies into the original.
class Flat {
 public:
  Flat() = default;
  Flat(const at::Tensor& t, bool copyIn);
  void* data() const { return buffer_.data_ptr(); }
  size_t count() const { return static_cast<size_t>(buffer_.numel()); }
  size_t bytes() const { return count() * buffer_.element_size(); }
  const at::Tensor& buffer() const { return buffer_; }
  void writeBack();

 private:
  at::Tensor original_, buffer_;
  bool copy_ = false;
};

// The real tensor eccl works on for `t` (complex as its real view).
at::Tensor realView(const at::Tensor& t);

}  // namespace torch_eccl
