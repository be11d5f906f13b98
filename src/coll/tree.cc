#include <algorithm>
#include <vector>

#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

BinaryTree binaryTree(int r, int n) {
  BinaryTree t;
  t.parent = r == 0 ? -1 : (r - 1) / 2;
  for (int c = 2 * r + 1; c <= 2 * r + 2 && c < n; ++c) t.children[t.childCount++] = c;
  return t;
}

// Reduce up the tree, then broadcast the root's result down, both in
// segments so a deep tree forwards one segment while the next arrives.
// Every node folds (its own data) op (first child) op (second child), and
// every rank ends with the root's bits, so the result is identical
// everywhere and from run to run. Out of place the input is read where it
// lies (a leaf sends it, a node folds it with its first child's into the
// output): nothing copies it into the output first.
void allreduceTree(Links& links, const void* in, void* outv, size_t count, ecclDataType_t type, ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t elem = typeSize(type), bytes = count * elem;
  auto* out = static_cast<uint8_t*>(outv);
  const auto* own = static_cast<const uint8_t*>(in);
  if (n == 1 && out != in && bytes) copyBytes(out, in, bytes);
  if (n == 1 || bytes == 0) return;
  const BinaryTree tree = binaryTree(r, n);
  const size_t segElems = std::max<size_t>(kTreeSegmentBytes / elem, (count + kMaxSegments - 1) / kMaxSegments);
  const size_t segments = (count + segElems - 1) / segElems;
  auto first = [&](size_t k) { return k * segElems; };
  auto elems = [&](size_t k) { return std::min(segElems, count - first(k)); };

  uint8_t* fromChildren = links.scratch(kRingScratchSlot, bytes * std::max(tree.childCount, 1));
  std::vector<RequestPtr> recvs, sends;
  for (size_t k = 0; k < segments; ++k)
    for (int c = 0; c < tree.childCount; ++c)
      recvs.push_back(links.irecv(tree.children[c], makeTag(0, 0, k), fromChildren + c * bytes + first(k) * elem,
                                  elems(k) * elem));
  for (size_t k = 0; k < segments; ++k) {
    uint8_t* seg = out + first(k) * elem;
    const uint8_t* mine = own + first(k) * elem;
    for (int c = 0; c < tree.childCount; ++c) {
      links.wait(recvs[k * tree.childCount + c]);
      reduce(seg, c == 0 ? mine : seg, fromChildren + c * bytes + first(k) * elem, elems(k), type, op);
    }
    const uint8_t* up = tree.childCount ? seg : mine;
    if (tree.parent >= 0) sends.push_back(links.isend(tree.parent, makeTag(0, 0, k), up, elems(k) * elem));
  }
  // The down phase overwrites `out`, so the up sends must be off it first.
  links.waitAll(sends);
  recvs.clear();
  if (tree.parent >= 0)
    for (size_t k = 0; k < segments; ++k)
      recvs.push_back(links.irecv(tree.parent, makeTag(1, 0, k), out + first(k) * elem, elems(k) * elem));
  for (size_t k = 0; k < segments; ++k) {
    if (tree.parent >= 0) links.wait(recvs[k]);
    for (int c = 0; c < tree.childCount; ++c)
      sends.push_back(links.isend(tree.children[c], makeTag(1, 0, k), out + first(k) * elem, elems(k) * elem));
  }
  links.waitAll(sends);
}

// Children report to their parent up to the root, which releases them back
// down: nobody leaves before everyone has arrived.
void barrierTree(Links& links) {
  const int n = links.size(), r = links.rank();
  if (n == 1) return;
  const BinaryTree tree = binaryTree(r, n);
  uint8_t token = 0, got[2] = {0, 0}, release = 0;
  std::vector<RequestPtr> reqs;
  for (int c = 0; c < tree.childCount; ++c) reqs.push_back(links.irecv(tree.children[c], makeTag(0, 0, 0), &got[c], 1));
  links.waitAll(reqs);
  if (tree.parent >= 0) {
    reqs.push_back(links.isend(tree.parent, makeTag(0, 0, 0), &token, 1));
    reqs.push_back(links.irecv(tree.parent, makeTag(1, 0, 0), &release, 1));
    links.waitAll(reqs);
  }
  for (int c = 0; c < tree.childCount; ++c) reqs.push_back(links.isend(tree.children[c], makeTag(1, 0, 0), &token, 1));
  links.waitAll(reqs);
}

}  // namespace eccl::coll
