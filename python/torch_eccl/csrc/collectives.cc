// The collectives and point-to-point ops of the backend: checked on the
// caller's thread, run on the driver thread. Data movement (broadcast,
// gathers, all-to-all, send/recv) moves bytes, so it takes every dtype;
// reductions take the types eccl reduces (tensors.h).
#include <c10/util/Exception.h>

#include <functional>
#include <numeric>

#include "process_group.h"
#include "streams.h"
#include "tensors.h"

namespace torch_eccl {

using c10d::OpType;
using c10::intrusive_ptr;

namespace {

// The coalesced tensor collectives' op types; a torch without them
// (before 2.1x) calls both COALESCED, as its own Gloo does.
#if TORCH_ECCL_COALESCED_OP_TYPES
constexpr OpType kAllgatherIntoTensorCoalesced = OpType::ALLGATHER_INTO_TENSOR_COALESCED;
constexpr OpType kReduceScatterTensorCoalesced = OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr OpType kAllgatherIntoTensorCoalesced = OpType::COALESCED;
constexpr OpType kReduceScatterTensorCoalesced = OpType::COALESCED;
#endif

// Posts between ecclGroupStart and ecclGroupEnd, ending the group even
// when posting throws (the group state belongs to this thread).
template <typename F>
void inGroup(const F& post, const std::function<void(ecclResult_t, const char*)>& check, const char* what) {
  check(ecclGroupStart(), what);
  try {
    post();
  } catch (...) {
    ecclGroupEnd();
    throw;
  }
  check(ecclGroupEnd(), what);
}

void preScale(const Flat& f, const Reduction& red) {
  if (red.preScale) f.buffer().mul_(*red.preScale);
  if (red.preScaleTensor) f.buffer().mul_(*red.preScaleTensor);
}

// Flat byte copies of a list of tensors, back to back.
at::Tensor packBytes(const std::vector<at::Tensor>& ts) {
  int64_t total = 0;
  for (const auto& t : ts) total += t.numel() * t.element_size();
  at::Tensor out = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  int64_t at = 0;
  for (const auto& t : ts) {
    int64_t n = t.numel() * t.element_size();
    if (n) out.narrow(0, at, n).copy_(realView(t).contiguous().view({-1}).view(at::kByte));
    at += n;
  }
  return out;
}

void unpackBytes(const at::Tensor& bytes, std::vector<at::Tensor>& ts) {
  int64_t at = 0;
  for (auto& t : ts) {
    int64_t n = t.numel() * t.element_size();
    if (n) {
      at::Tensor chunk = bytes.narrow(0, at, n);
      if (at % t.element_size()) chunk = chunk.clone();  // a view of another dtype must be aligned to it
      realView(t).copy_(chunk.view(realView(t).scalar_type()).view(realView(t).sizes()));
    }
    at += n;
  }
}

}  // namespace

intrusive_ptr<c10d::Work> ProcessGroupEccl::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return allreduceSparse(tensors[0], opts);
  checkSingle(tensors, "allreduce");
  TORCH_CHECK_VALUE(!opts.sparseIndices, "eccl allreduce: sparse indices are not supported");
  at::Tensor t = tensors[0];
  ecclDataType_t type = reductionType(t.scalar_type(), "allreduce");
  Reduction red = reduction(opts.reduceOp, t.scalar_type(), "allreduce");
  return enqueue(OpType::ALLREDUCE, "allreduce", {t}, {t}, [this, t, type, red] {
    Flat f(t, true);
    preScale(f, red);
    check(ecclAllReduce(f.data(), f.data(), f.count(), type, red.op, comm_, opStream()), "allreduce");
    f.writeBack();
  }, opts.asyncOp);
}

// Tensors of one dtype are reduced as one flat buffer (one op, one pass);
// mixed dtypes go one tensor at a time, still in one work.
intrusive_ptr<c10d::Work> ProcessGroupEccl::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  checkTensors(tensors, "allreduce_coalesced");
  TORCH_CHECK_VALUE(!tensors.empty(), "eccl allreduce_coalesced: no tensors");
  std::vector<std::pair<ecclDataType_t, Reduction>> plan;
  bool oneType = true;
  for (const auto& t : tensors) {
    plan.emplace_back(reductionType(t.scalar_type(), "allreduce_coalesced"),
                      reduction(opts.reduceOp, t.scalar_type(), "allreduce_coalesced"));
    oneType = oneType && t.scalar_type() == tensors[0].scalar_type();
  }
  return enqueue(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, tensors,
                 [this, tensors, plan, oneType]() mutable {
                   if (oneType) {
                     std::vector<at::Tensor> flat;
                     for (const auto& t : tensors) flat.push_back(realView(t).reshape({-1}));
                     at::Tensor all = at::cat(flat);
                     Flat f(all, true);
                     preScale(f, plan[0].second);
                     check(ecclAllReduce(f.data(), f.data(), f.count(), plan[0].first, plan[0].second.op, comm_, opStream()),
                           "allreduce_coalesced");
                     int64_t at = 0;
                     for (auto& t : tensors) {
                       at::Tensor r = realView(t);
                       r.copy_(all.narrow(0, at, r.numel()).view(r.sizes()));
                       at += r.numel();
                     }
                     return;
                   }
                   for (size_t i = 0; i < tensors.size(); ++i) {
                     Flat f(tensors[i], true);
                     preScale(f, plan[i].second);
                     check(ecclAllReduce(f.data(), f.data(), f.count(), plan[i].first, plan[i].second.op, comm_, opStream()),
                           "allreduce_coalesced");
                     f.writeBack();
                   }
                 }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  int root = checkedPeer(opts.rootRank, "broadcast root");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "eccl broadcast: rootTensor must be 0 (one tensor per process)");
  at::Tensor t = tensors[0];
  return enqueue(OpType::BROADCAST, "broadcast", {t}, {t}, [this, t, root] {
    bool isRoot = rank_ == root;
    Flat f(t, isRoot);
    check(ecclBroadcast(f.data(), f.data(), f.bytes(), ecclUint8, root, comm_, opStream()), "broadcast");
    if (!isRoot) f.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checkSingle(tensors, "reduce");
  int root = checkedPeer(opts.rootRank, "reduce root");
  at::Tensor t = tensors[0];
  ecclDataType_t type = reductionType(t.scalar_type(), "reduce");
  Reduction red = reduction(opts.reduceOp, t.scalar_type(), "reduce");
  return enqueue(OpType::REDUCE, "reduce", {t}, {t}, [this, t, type, red, root] {
    Flat f(t, true);
    preScale(f, red);
    check(ecclReduce(f.data(), f.data(), f.count(), type, red.op, root, comm_, opStream()), "reduce");
    if (rank_ == root) f.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  checkSingle(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1, "eccl allgather: takes one output list per process, got ", outputs.size());
  TORCH_CHECK_VALUE(static_cast<int>(outputs[0].size()) == size_, "eccl allgather: the output list has ",
                    outputs[0].size(), " tensors for ", size_, " ranks");
  for (const auto& o : outputs[0]) {
    checkTensor(o, "allgather");
    checkSameTypeAndShape(inputs[0], o, "allgather", "an output tensor");
  }
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(OpType::ALLGATHER, "allgather", outs, {in}, [this, in, outs]() mutable {
    Flat f(in, true);
    at::Tensor all = at::empty({static_cast<int64_t>(f.bytes()) * size_}, at::TensorOptions().dtype(at::kByte));
    check(ecclAllGather(f.data(), all.data_ptr(), f.bytes(), ecclUint8, comm_, opStream()), "allgather");
    unpackBytes(all, outs);
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::all_gather_single(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  checkTensor(output, "all_gather_into_tensor");
  checkTensor(input, "all_gather_into_tensor");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "eccl all_gather_into_tensor: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "eccl all_gather_into_tensor: output has ",
                    output.numel(), " elements, expected ", input.numel(), " x ", size_, " ranks");
  at::Tensor in = input, out = output;
  return enqueue(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {out}, {in}, [this, in, out] {
    Flat i(in, true), o(out, false);
    check(ecclAllGather(i.data(), o.data(), i.bytes(), ecclUint8, comm_, opStream()), "all_gather_into_tensor");
    o.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "eccl all_gather_into_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  for (size_t k = 0; k < inputs.size(); ++k) {
    checkTensor(inputs[k], "all_gather_into_tensor_coalesced");
    checkTensor(outputs[k], "all_gather_into_tensor_coalesced");
    TORCH_CHECK_VALUE(outputs[k].numel() == inputs[k].numel() * size_ &&
                          outputs[k].scalar_type() == inputs[k].scalar_type(),
                      "eccl all_gather_into_tensor_coalesced: output ", k, " does not hold ", size_, " inputs");
  }
  return enqueue(kAllgatherIntoTensorCoalesced, "all_gather_into_tensor_coalesced", outputs, inputs,
                 [this, inputs, outputs] {
                   for (size_t k = 0; k < inputs.size(); ++k) {
                     Flat i(inputs[k], true), o(outputs[k], false);
                     check(ecclAllGather(i.data(), o.data(), i.bytes(), ecclUint8, comm_, opStream()),
                           "all_gather_into_tensor_coalesced");
                     o.writeBack();
                   }
                 }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  checkTensors(inputs, "allgather_coalesced");
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_, "eccl allgather_coalesced: ", outputs.size(),
                    " output lists for ", size_, " ranks");
  for (const auto& list : outputs) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), "eccl allgather_coalesced: an output list has ", list.size(),
                      " tensors for ", inputs.size(), " inputs");
    for (size_t k = 0; k < inputs.size(); ++k) checkSameTypeAndShape(inputs[k], list[k], "allgather_coalesced", "an output");
  }
  std::vector<at::Tensor> flatOuts;
  for (auto& list : outputs) flatOuts.insert(flatOuts.end(), list.begin(), list.end());
  return enqueue(OpType::ALLGATHER_COALESCED, "allgather_coalesced", flatOuts, inputs, [this, inputs, outputs]() mutable {
    at::Tensor mine = packBytes(inputs);
    at::Tensor all = at::empty({mine.numel() * size_}, mine.options());
    check(ecclAllGather(mine.data_ptr(), all.data_ptr(), mine.numel(), ecclUint8, comm_, opStream()), "allgather_coalesced");
    for (int r = 0; r < size_; ++r) unpackBytes(all.narrow(0, r * mine.numel(), mine.numel()), outputs[r]);
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  checkSingle(inputs, "gather");
  int root = checkedPeer(opts.rootRank, "gather root");
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "eccl gather: the root needs one list of ",
                      size_, " output tensors");
    for (const auto& o : outputs[0]) checkSameTypeAndShape(inputs[0], o, "gather", "an output tensor");
    outs = outputs[0];
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "eccl gather: only the root takes output tensors");
  }
  at::Tensor in = inputs[0];
  return enqueue(OpType::GATHER, "gather", outs, {in}, [this, in, outs, root]() mutable {
    Flat mine(in, true);
    std::vector<Flat> flats;
    if (rank_ == root)
      for (int r = 0; r < size_; ++r) flats.emplace_back(outs[r], false);
    inGroup(
        [&] {
          if (rank_ != root) return check(ecclSend(mine.data(), mine.bytes(), ecclUint8, root, comm_, opStream()), "gather");
          for (int r = 0; r < size_; ++r)
            if (r != root) check(ecclRecv(flats[r].data(), flats[r].bytes(), ecclUint8, r, comm_, opStream()), "gather");
        },
        [this](ecclResult_t rc, const char* w) { check(rc, w); }, "gather");
    if (rank_ == root) {
      flats[root].buffer().copy_(mine.buffer());
      for (auto& f : flats) f.writeBack();
    }
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  int root = checkedPeer(opts.rootRank, "scatter root");
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "eccl scatter: the root needs one list of ",
                      size_, " input tensors");
    for (const auto& i : inputs[0]) checkSameTypeAndShape(outputs[0], i, "scatter", "an input tensor");
    ins = inputs[0];
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "eccl scatter: only the root takes input tensors");
  }
  at::Tensor out = outputs[0];
  return enqueue(OpType::SCATTER, "scatter", {out}, ins, [this, out, ins, root] {
    Flat mine(out, false);
    std::vector<Flat> flats;
    if (rank_ == root)
      for (int r = 0; r < size_; ++r) flats.emplace_back(ins[r], true);
    inGroup(
        [&] {
          if (rank_ != root) return check(ecclRecv(mine.data(), mine.bytes(), ecclUint8, root, comm_, opStream()), "scatter");
          for (int r = 0; r < size_; ++r)
            if (r != root) check(ecclSend(flats[r].data(), flats[r].bytes(), ecclUint8, r, comm_, opStream()), "scatter");
        },
        [this](ecclResult_t rc, const char* w) { check(rc, w); }, "scatter");
    if (rank_ == root) mine.buffer().copy_(flats[root].buffer());
    mine.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "eccl reduce_scatter: needs one list of ",
                    size_, " input tensors");
  for (const auto& i : inputs[0]) checkSameTypeAndShape(outputs[0], i, "reduce_scatter", "an input tensor");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = inputs[0];
  ecclDataType_t type = reductionType(out.scalar_type(), "reduce_scatter");
  Reduction red = reduction(opts.reduceOp, out.scalar_type(), "reduce_scatter");
  return enqueue(OpType::REDUCE_SCATTER, "reduce_scatter", {out}, ins, [this, out, ins, type, red] {
    std::vector<at::Tensor> flat;
    for (const auto& i : ins) flat.push_back(realView(i).reshape({-1}));
    Flat all(at::cat(flat), true);
    preScale(all, red);
    Flat o(out, false);
    check(ecclReduceScatter(all.data(), o.data(), o.count(), type, red.op, comm_, opStream()), "reduce_scatter");
    o.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  checkTensor(output, "reduce_scatter_tensor");
  checkTensor(input, "reduce_scatter_tensor");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "eccl reduce_scatter_tensor: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "eccl reduce_scatter_tensor: input has ", input.numel(),
                    " elements, expected ", output.numel(), " x ", size_, " ranks");
  ecclDataType_t type = reductionType(output.scalar_type(), "reduce_scatter_tensor");
  Reduction red = reduction(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
  at::Tensor in = input, out = output;
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out}, {in}, [this, in, out, type, red] {
    // The input is read, never written: a prescale works on a copy.
    Flat i(red.preScale || red.preScaleTensor ? realView(in).clone() : in, true), o(out, false);
    preScale(i, red);
    check(ecclReduceScatter(i.data(), o.data(), o.count(), type, red.op, comm_, opStream()), "reduce_scatter_tensor");
    o.writeBack();
  }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "eccl reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  std::vector<std::pair<ecclDataType_t, Reduction>> plan;
  for (size_t k = 0; k < inputs.size(); ++k) {
    checkTensor(inputs[k], "reduce_scatter_tensor_coalesced");
    checkTensor(outputs[k], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK_VALUE(inputs[k].numel() == outputs[k].numel() * size_ &&
                          outputs[k].scalar_type() == inputs[k].scalar_type(),
                      "eccl reduce_scatter_tensor_coalesced: input ", k, " does not hold ", size_, " outputs");
    plan.emplace_back(reductionType(outputs[k].scalar_type(), "reduce_scatter_tensor_coalesced"),
                      reduction(opts.reduceOp, outputs[k].scalar_type(), "reduce_scatter_tensor_coalesced"));
  }
  return enqueue(kReduceScatterTensorCoalesced, "reduce_scatter_tensor_coalesced", outputs, inputs,
                 [this, inputs, outputs, plan] {
                   for (size_t k = 0; k < inputs.size(); ++k) {
                     auto& [type, red] = plan[k];
                     Flat i(red.preScale || red.preScaleTensor ? realView(inputs[k]).clone() : inputs[k], true);
                     Flat o(outputs[k], false);
                     preScale(i, red);
                     check(ecclReduceScatter(i.data(), o.data(), o.count(), type, red.op, comm_, opStream()),
                           "reduce_scatter_tensor_coalesced");
                     o.writeBack();
                   }
                 }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& outputSplits,
                                                              std::vector<int64_t>& inputSplits,
                                                              const c10d::AllToAllOptions& opts) {
  checkTensor(output, "all_to_all_single");
  checkTensor(input, "all_to_all_single");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "eccl all_to_all_single: output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  auto splits = [&](const at::Tensor& t, std::vector<int64_t> given, const char* which) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (given.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "eccl all_to_all_single: ", which, " has ", rows,
                        " rows, not divisible by ", size_, " ranks (give split sizes)");
      given.assign(size_, rows / size_);
    }
    TORCH_CHECK_VALUE(static_cast<int>(given.size()) == size_, "eccl all_to_all_single: ", given.size(), " ", which,
                      " split sizes for ", size_, " ranks");
    int64_t sum = 0;
    for (int64_t s : given) {
      TORCH_CHECK_VALUE(s >= 0, "eccl all_to_all_single: negative ", which, " split size ", s);
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == rows, "eccl all_to_all_single: ", which, " split sizes add up to ", sum, ", it has ", rows,
                      " rows");
    int64_t rowBytes = rows ? t.numel() / rows * static_cast<int64_t>(t.element_size()) : 0;
    std::vector<size_t> counts, displs;
    size_t at = 0;
    for (int64_t s : given) {
      counts.push_back(static_cast<size_t>(s * rowBytes));
      displs.push_back(at);
      at += counts.back();
    }
    return std::make_pair(counts, displs);
  };
  // Pairs, not structured bindings: clang before 16 cannot capture those.
  auto send = splits(input, inputSplits, "input");
  auto recv = splits(output, outputSplits, "output");
  at::Tensor in = input, out = output;
  return enqueue(OpType::ALLTOALL_BASE, "all_to_all_single", {out}, {in},
                 [this, in, out, send, recv] {
                   Flat i(in, true), o(out, false);
                   check(ecclAllToAllv(i.data(), send.first.data(), send.second.data(), o.data(), recv.first.data(),
                                       recv.second.data(), ecclUint8, comm_, opStream()),
                         "all_to_all_single");
                   o.writeBack();
                 }, opts.asyncOp);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  checkTensors(outputs, "all_to_all");
  checkTensors(inputs, "all_to_all");
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                    "eccl all_to_all: needs ", size_, " input and output tensors, got ", inputs.size(), " and ",
                    outputs.size());
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;
  size_t s = 0, r = 0;
  for (int k = 0; k < size_; ++k) {
    TORCH_CHECK_TYPE(inputs[k].scalar_type() == inputs[0].scalar_type() &&
                         outputs[k].scalar_type() == inputs[0].scalar_type(),
                     "eccl all_to_all: every tensor must have one dtype");
    sendCounts.push_back(inputs[k].numel() * inputs[k].element_size());
    recvCounts.push_back(outputs[k].numel() * outputs[k].element_size());
    sendDispls.push_back(s), recvDispls.push_back(r);
    s += sendCounts.back(), r += recvCounts.back();
  }
  return enqueue(OpType::ALLTOALL, "all_to_all", outputs, inputs,
                 [this, inputs, outputs, sendCounts, sendDispls, recvCounts, recvDispls, r]() mutable {
                   at::Tensor packed = packBytes(inputs);
                   at::Tensor got = at::empty({static_cast<int64_t>(r)}, packed.options());
                   check(ecclAllToAllv(packed.data_ptr(), sendCounts.data(), sendDispls.data(), got.data_ptr(),
                                       recvCounts.data(), recvDispls.data(), ecclUint8, comm_, opStream()),
                         "all_to_all");
                   unpackBytes(got, outputs);
                 }, opts.asyncOp);
}

// Messages between two ranks are matched in the order they were issued;
// tags are not used for matching (as with NCCL). Sends and receives are
// posted without blocking: the ops issued after them run meanwhile.
intrusive_ptr<c10d::Work> ProcessGroupEccl::send(std::vector<at::Tensor>& tensors, int dstRank, int) {
  checkSingle(tensors, "send");
  int peer = checkedPeer(dstRank, "send destination");
  TORCH_CHECK_VALUE(peer != rank_, "eccl send: rank ", rank_, " cannot send to itself");
  return enqueueP2p(OpType::SEND, "send", tensors[0], peer, true);
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::recv(std::vector<at::Tensor>& tensors, int srcRank, int) {
  checkSingle(tensors, "recv");
  int peer = checkedPeer(srcRank, "recv source");
  TORCH_CHECK_VALUE(peer != rank_, "eccl recv: rank ", rank_, " cannot receive from itself");
  return enqueueP2p(OpType::RECV, "recv", tensors[0], peer, false);
}

// A posted send or receive the driver polls: false while pending; true
// once it completed (freed). Past `deadline` the blocking wait judges the
// peer (a liveness probe; a silent peer is declared failed). A failure is
// raised (the request freed first).
static bool settlePolled(ecclComm_t comm, ecclRequest_t request, std::chrono::steady_clock::time_point deadline,
                         const char* name) {
  int done = 0;
  ecclResult_t r = ecclTest(request, &done);
  if (r == ecclSuccess && !done && std::chrono::steady_clock::now() >= deadline) r = ecclWait(request), done = 1;
  if (r != ecclSuccess) {
    std::string why = ecclGetLastError(comm);
    ecclRequestFree(request);
    TORCH_CHECK_WITH(DistBackendError, false, "eccl ", name, " (", ecclGetErrorString(r), "): ", why);
  }
  if (!done) return false;
  ecclRequestFree(request);
  return true;
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::enqueueP2p(OpType type, const char* name, const at::Tensor& t, int peer,
                                                       bool isSend) {
  requireRank(name);
  // CUDA tensors: stream-ordered like the collectives (the GPU waits, not
  // this process); host tensors: posted and polled, so a pending receive
  // does not hold up the ops issued after it.
  if (t.is_cuda())
    return enqueue(type, name, isSend ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{t},
                   std::vector<at::Tensor>{t}, [this, t, peer, isSend, name] {
                     Flat flat(t, isSend);
                     check(isSend ? ecclSend(flat.data(), flat.bytes(), ecclUint8, peer, comm_, opStream())
                                  : ecclRecv(flat.data(), flat.bytes(), ecclUint8, peer, comm_, opStream()),
                           name);
                     if (!isSend) flat.writeBack();
                   }, true);
  seq_++;
  auto work = c10::make_intrusive<EcclWork>(rank_, type, name, isSend ? std::vector<at::Tensor>{}
                                                                      : std::vector<at::Tensor>{t},
                                            std::vector<at::Tensor>{t});
  if (!isSend) work->setSourceRank(peer);
  driver_->postPolled(work, [this, t, peer, isSend, name]() -> Poller {
    auto flat = std::make_shared<Flat>(t, isSend);
    ecclRequest_t request = nullptr;
    check(isSend ? ecclIsend(flat->data(), flat->bytes(), ecclUint8, peer, comm_, &request)
                 : ecclIrecv(flat->data(), flat->bytes(), ecclUint8, peer, comm_, &request),
          name);
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    return [this, flat, request, deadline, isSend, name]() {
      if (!settlePolled(comm_, request, deadline, name)) return false;
      if (!isSend) flat->writeBack();
      return true;
    };
  });
  return work;
}

// A probe until some rank's next message has arrived, then a receive from
// that rank (ecclIprobe): the message that came first is taken.
intrusive_ptr<c10d::Work> ProcessGroupEccl::recvAnysource(std::vector<at::Tensor>& tensors, int) {
  checkSingle(tensors, "recvAnysource");
  requireRank("recvAnysource");
  const at::Tensor t = tensors[0];
  TORCH_CHECK_VALUE(!t.is_cuda(), "eccl recv from any source takes host tensors (name the source for a CUDA tensor)");
  seq_++;
  auto work = c10::make_intrusive<EcclWork>(rank_, OpType::RECVANYSOURCE, "recvAnySource", std::vector<at::Tensor>{t},
                                            std::vector<at::Tensor>{t});
  driver_->postPolled(work, [this, t, work]() -> Poller {
    auto flat = std::make_shared<Flat>(t, false);
    auto request = std::make_shared<ecclRequest_t>(nullptr);
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    return [this, flat, request, deadline, work]() {
      if (!*request) {
        int peer = ECCL_ANY_SOURCE, arrived = 0;
        size_t bytes = 0;
        check(ecclIprobe(&peer, &arrived, &bytes, comm_), "recv from any source");
        if (!arrived) {
          TORCH_CHECK_WITH(DistBackendError, std::chrono::steady_clock::now() < deadline,
                           "eccl recv from any source: Timed out waiting ", timeout_.count(),
                           "ms for a message from any rank");
          return false;
        }
        check(ecclIrecv(flat->data(), flat->bytes(), ecclUint8, peer, comm_, request.get()), "recv from any source");
        work->setSourceRank(peer);
      }
      if (!settlePolled(comm_, *request, deadline, "recv from any source")) return false;
      flat->writeBack();
      return true;
    };
  });
  return work;
}

intrusive_ptr<c10d::Work> ProcessGroupEccl::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(OpType::BARRIER, "barrier", {}, {}, [this] { check(ecclBarrier(comm_), "barrier"); }, opts.asyncOp);
}

}  // namespace torch_eccl
