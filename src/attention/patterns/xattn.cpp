// XAttention: per query head and query block, block 0, the diagonal and the highest-scoring blocks up to softmax mass
// tau, from antidiagonal scores (xattn_select). Without a selection (decode steps, a chunk that does not start on a
// block boundary) the head attends densely: the method is a prefill method.
#include "elastic/sparse_pattern.h"

namespace elastic {

extern const SparsePattern kXAttnPattern;
const SparsePattern kXAttnPattern{
    .name = "xattn",
    .aliases = {"xa"},
    .letter = 'X',
    .keeps = [](int qb, int kb, const SparseSettings&, const BlockMask* sel) {
      return !sel || sel->n_blocks == 0 || sel->at(qb, kb);
    },
    .select =
        [](const float* q, const float* k, int n_pos, int hd, const SparseSettings& s) {
          XAttnParams p = s.xattn;
          p.block = s.block;
          return xattn_select(q, k, n_pos, hd, p);
        },
    .on_cuda = true,
};

}  // namespace elastic
