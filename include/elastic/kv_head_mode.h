#pragma once
// The head modes the CUDA kernels implement, as the int32 values KVHeadMeta::mode carries to the device: the values
// of elastic::HeadMode (the sparse-pattern registry's order; src/attention/patterns/registry.cpp checks them). Host
// and device code compare against these names, never against bare numbers.
#include <cstdint>

namespace elastic::kv_mode {

constexpr int32_t kFull = 0;
constexpr int32_t kStreaming = 1;
constexpr int32_t kXAttn = 2;

}  // namespace elastic::kv_mode
