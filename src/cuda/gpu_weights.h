#pragma once
// What the GPU model shares with the GPU trainer (src/cuda/gpu_router_step.cpp), and nothing else of its state: the
// bf16 weights (GpuWeights) and the context they run in (GpuExec: stream, cuBLASLt GEMM, attention kernel). The
// model's sequences, pages, decode graphs and work buffers stay in GpuModel::Impl.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "elastic/config.h"
#include "elastic/cuda_attention.h"
#include "elastic/cuda_gemm.h"

namespace elastic::cuda {

std::string gib(size_t bytes);  // "1.25 GiB", for the printed allocation plans (the model's and the trainer's)

struct GpuLayer {              // bf16, HF [out, in] layouts
  DeviceBuffer attn_norm;      // [D]
  DeviceBuffer w_qkv, b_qkv;   // [(Hq + 2 Hkv) hd, D], bias [(Hq + 2 Hkv) hd] or empty
  DeviceBuffer q_norm, k_norm; // [hd] (Qwen3) or empty
  DeviceBuffer wo;             // [D, Hq hd]
  DeviceBuffer mlp_norm;       // [D]
  DeviceBuffer w_gu;           // [2F, D]: gate rows then up rows
  DeviceBuffer w_down;         // [D, F]
};

struct GpuWeights {
  ModelConfig c;
  std::vector<GpuLayer> layers;
  DeviceBuffer embed, lm_head, final_norm;  // lm_head empty when tied
  DeviceBuffer inv_freq;                     // [hd/2] fp32
  const uint16_t* head_weight() const { return (lm_head.ptr ? lm_head : embed).as<const uint16_t>(); }
  size_t bytes() const;                      // every weight buffer (inv_freq aside)
};

struct GpuExec {
  cudaStream_t stream = nullptr;
  Gemm* gemm = nullptr;
  AttnKernelConfig attention;  // the prefill attention kernel the model was built with
  XAttnEstimateKernel xattn_estimate = XAttnEstimateKernel::Gemm;  // GpuOptions::xattn_estimate
};

}  // namespace elastic::cuda
