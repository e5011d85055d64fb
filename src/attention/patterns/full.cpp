// Full attention: every causal key block.
#include "elastic/sparse_pattern.h"

namespace elastic {

extern const SparsePattern kFullPattern;
const SparsePattern kFullPattern{
    .name = "full",
    .aliases = {"fa"},
    .letter = 'F',
    .keeps = [](int, int, const SparseSettings&, const BlockMask*) { return true; },
    .on_cuda = true,
};

}  // namespace elastic
