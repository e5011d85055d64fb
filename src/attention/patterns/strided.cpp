// Strided (a toy pattern, CPU reference only): every kEvery-th key block from block 0, plus the diagonal. It shows
// what a new pattern takes: this file and one line in registry.cpp. The CUDA backend refuses it by name (on_cuda).
#include "elastic/sparse_pattern.h"

namespace elastic {

constexpr int kEvery = 4;

extern const SparsePattern kStridedPattern;
const SparsePattern kStridedPattern{
    .name = "strided",
    .aliases = {},
    .letter = 'T',
    .keeps = [](int qb, int kb, const SparseSettings&, const BlockMask*) { return kb == qb || kb % kEvery == 0; },
};

}  // namespace elastic
