// GpuModel's forward passes: layer-major routed prefill into paged per-head KV memory, and decode steps replayed
// through one CUDA graph per sequence.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda/gpu_model_impl.h"
#include "cuda/programmatic_launch.h"
#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"
#include "elastic/sparse_pattern.h"

namespace elastic::cuda {
namespace {

uint16_t* row_ptr(const DeviceBuffer& b, size_t row, size_t width) { return b.as<uint16_t>() + row * width; }

// The routing's sparse settings as the kernels read them.
KVHeadMeta meta_for(HeadMode m, const SparseSettings& s) {
  return make_kv_head_meta(m, s.sink, s.local, s.block);  // refuses a pattern the kernels do not implement
}

}  // namespace

GpuModel::Impl::Slot& GpuModel::Impl::slot_at(int slot) {
  if (slot < 0 || slot >= static_cast<int>(slots.size()))
    throw std::out_of_range("gpu: no slot " + std::to_string(slot) + " (the model has " +
                            std::to_string(slots.size()) + ")");
  return slots[static_cast<size_t>(slot)];
}

void GpuModel::Impl::store_layer_pages(Slot& sl, int l, const HeadMode* modes, const SparseSettings& s, int T) {
  const int Hkv = c.n_kv_heads, hd = c.head_dim, P = kPageSize;
  RoutingTable lr = RoutingTable::all_full(1, Hkv);
  std::copy(modes, modes + Hkv, lr.mode.begin());
  lr.sparse = s;
  sl.seq[l] = std::make_unique<SequencePages>(*pages, lr);
  tables_dirty = true;
  // A block at a time, returning what leaves a streaming head's window, so the pool never holds more of a head than
  // its window plus a block; what is left is what the first decode step attends.
  for (int c0 = 0; c0 < T; c0 += s.block) {
    sl.seq[l]->grow(std::min(T, c0 + s.block));
    sl.seq[l]->release_unused();
  }
  // Position page j of head h -> its pool page (or -1): the pages of a block are consecutive, in position order.
  const int n_pp = (T + P - 1) / P;
  std::vector<int32_t> map(size_t(Hkv) * pages_per_head, -1);
  for (int h = 0; h < Hkv; ++h) {
    const HeadPages& hp = sl.seq[l]->head(0, h);
    for (size_t i = 0, within = 0; i < hp.pages.size(); ++i) {
      within = i > 0 && hp.page_block[i - 1] == hp.page_block[i] ? within + 1 : 0;  // page index inside its block
      const int64_t pp = int64_t(hp.page_block[i]) * (s.block / P) + int64_t(within);
      if (pp < n_pp) map[size_t(h) * pages_per_head + pp] = hp.pages[i];
    }
  }
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(page_map.ptr, map.data(), map.size() * 4, cudaMemcpyHostToDevice, stream));
  paged_scatter(kscr.ptr, T, Hkv, hd, page_map.as<int32_t>(), pages_per_head, P, k_pool.ptr, stream);
  paged_scatter(vscr.ptr, T, Hkv, hd, page_map.as<int32_t>(), pages_per_head, P, v_pool.ptr, stream);
  // The map dies here and page_map is rewritten by the next layer: wait for the copies and the scatters.
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void GpuModel::Impl::upload_tables() {
  const int Hkv = c.n_kv_heads;
  h_table.clear();
  for (Slot& sl : slots) {
    if (!sl.live()) continue;
    sl.offsets.assign(size_t(c.n_layers) * Hkv, 0);
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < Hkv; ++h) {
        const HeadPages& hp = sl.seq[l]->head(0, h);
        sl.offsets[size_t(l) * Hkv + h] = static_cast<int32_t>(h_table.size());
        h_table.insert(h_table.end(), hp.pages.begin(), hp.pages.end());
      }
  }
  if (!h_table.empty())
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(page_table.ptr, h_table.data(), h_table.size() * 4, cudaMemcpyHostToDevice,
                                       stream));
  tables_dirty = false;
}

int GpuModel::Impl::max_units(int B) const {
  const int64_t keys = int64_t(c.n_kv_heads) * pages_per_head * kPageSize;  // a sequence's heads, all full
  if (o.batch_invariant)  // each sequence cut alone (paged_decode_plan_device's seq_heads)
    return B * paged_max_units(keys, c.n_kv_heads, target_units);
  return paged_max_units(B * keys, B * c.n_kv_heads, target_units);
}

void GpuModel::Impl::prepare_step(const std::vector<int>& batch, const std::vector<int32_t>& ids) {
  const int Hkv = c.n_kv_heads, L = c.n_layers, B = static_cast<int>(batch.size()), S = static_cast<int>(slots.size());
  // The previous step has finished (decode waits for it), so pages that left a window can be handed out again; a
  // block leaves a window only when a new block starts. A step retried after a failure finds its pages grown.
  for (int s : batch) {
    Slot& sl = slots[s];
    const int n = sl.length;
    for (int l = 0; l < L; ++l) {
      if (sl.seq[l]->length() == n + 1) continue;
      if (n % sl.seq[l]->routing().sparse.block == 0) sl.seq[l]->release_unused();
      sl.seq[l]->grow(n + 1);
    }
    if (n % kPageSize == 0) tables_dirty = true;  // a new page per head; a streaming head's window moved a block
  }
  if (tables_dirty) upload_tables();
  auto* io = reinterpret_cast<int32_t*>(h_step.data());
  auto* heads = reinterpret_cast<PagedDecodeHead*>(h_step.data() + size_t(16) * S);
  auto* rows = reinterpret_cast<int64_t*>(h_step.data() + rows_offset);
  for (int b = 0; b < B; ++b) {
    io[b] = ids[b];
    io[S + b] = 0;
    io[2 * S + b] = slots[batch[b]].length;
  }
  for (int l = 0; l < L; ++l)
    for (int b = 0; b < B; ++b) {
      const Slot& sl = slots[batch[b]];
      for (int h = 0; h < Hkv; ++h) {
        const size_t i = (size_t(l) * B + b) * Hkv + h, own = size_t(l) * Hkv + h;
        heads[i] = PagedDecodeHead{sl.offsets[own], sl.seq[l]->head(0, h).kept, 0, 0};
        rows[i] = sl.seq[l]->row(0, h, sl.length);
      }
    }
  // Two uploads: the ids and heads in use, then the rows in use.
  const size_t n_heads = size_t(L) * B * Hkv;
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(d_step.ptr, h_step.data(), size_t(16) * S + n_heads * sizeof(PagedDecodeHead),
                                     cudaMemcpyHostToDevice, stream));
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(d_step.as<uint8_t>() + rows_offset, h_step.data() + rows_offset,
                                     n_heads * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
}

void GpuModel::Impl::abort_prefill() {
  if (run.slot < 0) return;
  Slot& sl = slots[run.slot];
  sl.seq.clear();  // the layers stored so far give their pages back
  sl.length = 0;
  tables_dirty = true;
  for (auto& e : run.events) {
    if (e.first) cudaEventDestroy(e.first);
    if (e.second) cudaEventDestroy(e.second);
  }
  run = PrefillRun{};
}

void GpuModel::Impl::prefill_begin(int slot, const int32_t* ids_h, int T, const RoutingTable* fixed,
                                   const PromptRouter* router) {
  Slot& sl = slot_at(slot);
  const int D = c.hidden, Hkv = c.n_kv_heads, V = c.vocab, L = c.n_layers;
  if (run.slot >= 0 && run.slot != slot)
    throw std::logic_error("gpu prefill: slot " + std::to_string(run.slot) + "'s prefill is still running");
  if (T <= 0) throw std::invalid_argument("gpu prefill: empty prompt");
  if (T > o.max_ctx)
    throw std::invalid_argument("gpu prefill: prompt of " + std::to_string(T) + " tokens exceeds the plan's " +
                                std::to_string(o.max_ctx) + " positions");
  for (int t = 0; t < T; ++t)
    if (ids_h[t] < 0 || ids_h[t] >= V)
      throw std::invalid_argument("gpu prefill: token id " + std::to_string(ids_h[t]) + " at position " +
                                  std::to_string(t) + " is outside the vocabulary of " + std::to_string(V));
  if (fixed && (fixed->n_layers != L || fixed->n_kv_heads != Hkv))
    throw std::invalid_argument("gpu prefill: the routing table's layer/head counts do not match the model");
  RoutingTable r = fixed ? *fixed : RoutingTable::all_full(L, Hkv);
  if (!fixed && router) r.sparse = router->sparse();
  validate_sparse(r.sparse, "gpu prefill");
  const std::vector<int> pool_pos = router && !fixed ? boundary_positions(T, router->pool_first(), router->pool_last())
                                                     : std::vector<int>{};
  if (static_cast<int>(pool_pos.size()) > chunk)
    throw std::invalid_argument("gpu prefill: the chunk is smaller than the router's pool");

  abort_prefill();  // this slot's own unfinished prefill, if any
  sl.seq.clear();   // the previous sequence's pages back to the pool
  sl.length = 0;
  tables_dirty = true;
  sl.seq.resize(L);
  run.slot = slot;
  run.T = T;
  run.l = 0;
  run.t0 = 0;
  run.r = std::move(r);
  run.router = pool_pos.empty() ? nullptr : router;
  run.pool_pos = pool_pos;
  run.start = std::chrono::steady_clock::now();
  if (!xa_kept.ptr) xa_kept.alloc(sizeof(unsigned long long));
  ELASTIC_CUDA_CHECK(cudaMemsetAsync(xa_kept.ptr, 0, sizeof(unsigned long long), stream));
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(ids.ptr, ids_h, size_t(T) * 4, cudaMemcpyHostToDevice, stream));
  embed_rows_bf16(embed.as<uint16_t>(), ids.as<int32_t>(), hidden.as<uint16_t>(), T, D, V, stream);
  // ids_h may die when this returns: the copy has to be done with it.
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

bool GpuModel::Impl::prefill_advance() {  // GpuModel::prefill_step checked that a layer is left to run
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate;
  const int N = (Hq + 2 * Hkv) * hd, L = c.n_layers, T = run.T, l = run.l, t0 = run.t0;
  const SparseSettings& sp = run.r.sparse;
  cudaStream_t st = stream;
  const GpuLayer& W = layers[l];
  HeadMode* modes = run.r.mode.data() + size_t(l) * Hkv;
  KVHeadMeta* meta_l = meta.as<KVHeadMeta>() + size_t(l) * Hkv;

  QkvPostParams qp;
  qp.eps = c.rms_eps;
  qp.inv_freq = inv_freq.as<float>();
  qp.n_heads = Hq, qp.n_kv_heads = Hkv, qp.head_dim = hd;
  qp.q_out = q.as<uint16_t>();
  qp.k_out = kscr.as<uint16_t>();
  qp.v_out = vscr.as<uint16_t>();
  qp.bias = W.b_qkv.as<uint16_t>();
  qp.q_norm = W.q_norm.as<uint16_t>();
  qp.k_norm = W.k_norm.as<uint16_t>();

  if (t0 == 0) {  // the layer's first chunk: route it, then its kernels' metadata
    if (run.router) {
      // Route this layer from the boundary rows' keys (after k_norm, before RoPE), before any of its attention.
      const std::vector<int>& pool_pos = run.pool_pos;
      const int nb = static_cast<int>(pool_pos.size());
      // pool_pos is two ascending runs: copy each contiguous run of rows.
      for (int i = 0; i < nb;) {
        int j = i + 1;
        while (j < nb && pool_pos[j] == pool_pos[j - 1] + 1) ++j;
        rmsnorm_bf16_stream(row_ptr(hidden, pool_pos[i], D), W.attn_norm.as<uint16_t>(), row_ptr(xn, i, D), j - i, D,
                            c.rms_eps, st);
        i = j;
      }
      gemm->bf16(xn.as<uint16_t>(), W.w_qkv.as<uint16_t>(), qkv.as<uint16_t>(), nb, N, D, st);
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(pool.ptr, 0, pool.bytes, st));
      QkvPostParams pp = qp;
      pp.qkv = qkv.as<uint16_t>();
      pp.T = nb;
      pp.pos0 = 0;
      pp.pool_sum = pool.as<float>();
      pp.pool_first_end = nb;  // every row of this call is a pool row
      pp.pool_last_begin = nb;
      qkv_post(pp, st);  // q/k/v rows written here are scratch: the layer's pass below overwrites them
      std::vector<float> pooled(size_t(Hkv) * hd);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(pooled.data(), pool.ptr, pool.bytes, cudaMemcpyDeviceToHost, st));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
      for (float& x : pooled) x /= nb;
      run.router->decide(l, pooled.data(), modes);
    }
    std::vector<KVHeadMeta> meta_h(Hkv);
    run.xa_kv_heads.clear();
    for (int h = 0; h < Hkv; ++h) {
      meta_h[h] = meta_for(modes[h], sp);
      if (modes[h] == HeadMode::XAttn) run.xa_kv_heads.push_back(h);
    }
    const bool has_xattn = !run.xa_kv_heads.empty();
    // Pageable source: the copy is staged before this returns, so meta_h may die.
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(meta_l, meta_h.data(), Hkv * sizeof(KVHeadMeta), cudaMemcpyHostToDevice, st));
    run.lists = XAttnBlockLists{};
    if (has_xattn) {
      if (T > chunk) check_estimator_chunk(modes, size_t(Hkv), chunk, sp.block, "gpu prefill: ");  // as the CPU
      const int nbk = (o.max_ctx + sp.block - 1) / sp.block;
      if (xa_block != sp.block) {
        xa_blocks.alloc(size_t(xattn_list_capacity(Hq, nbk)) * 4);
        xa_offsets.alloc(size_t(Hq) * nbk * 4);
        xa_counts.alloc(size_t(Hq) * nbk * 4);
        xa_block = sp.block;
      }
      run.lists.blocks = xa_blocks.as<int32_t>();
      run.lists.offsets = xa_offsets.as<int32_t>();
      run.lists.counts = xa_counts.as<int32_t>();
      // The estimator's scratch for its longest call (the last chunk of a max_ctx prompt), every KV head scored.
      const size_t scratch =
          xattn_estimate_scratch_bytes(o.xattn_estimate, chunk, o.max_ctx, Hkv, Hq / Hkv, hd, sp.xattn.stride, sp.block);
      if (xa_scratch.bytes < scratch) xa_scratch.alloc(scratch);
    }
  }

  const int n = std::min(chunk, T - t0);
  uint16_t* h_rows = row_ptr(hidden, t0, D);
  rmsnorm_bf16_stream(h_rows, W.attn_norm.as<uint16_t>(), xn.as<uint16_t>(), n, D, c.rms_eps, st);
  gemm->bf16(xn.as<uint16_t>(), W.w_qkv.as<uint16_t>(), qkv.as<uint16_t>(), n, N, D, st);
  QkvPostParams pp = qp;
  pp.qkv = qkv.as<uint16_t>();
  pp.T = n;
  pp.pos0 = t0;
  qkv_post(pp, st);

  cudaEvent_t ea = nullptr, eb = nullptr;
  ELASTIC_CUDA_CHECK(cudaEventCreate(&ea));
  run.events.emplace_back(ea, nullptr);  // destroyed at prefill_end or abort_prefill
  ELASTIC_CUDA_CHECK(cudaEventCreate(&eb));
  run.events.back().second = eb;
  const auto ev = run.events.back();
  ELASTIC_CUDA_CHECK(cudaEventRecord(ev.first, st));
  if (run.lists.blocks) {  // the layer has XAttention heads
    XAttnEstimateParams ep;
    ep.q = q.as<uint16_t>();
    ep.k = kscr.as<uint16_t>();
    ep.T = n, ep.pos0 = t0, ep.n_heads = Hq, ep.n_kv_heads = Hkv, ep.head_dim = hd;
    ep.block = sp.block, ep.stride = sp.xattn.stride, ep.tau = sp.xattn.tau;
    ep.meta = meta_l;
    ep.blocks = xa_blocks.as<int32_t>();
    ep.offsets = xa_offsets.as<int32_t>();
    ep.counts = xa_counts.as<int32_t>();
    ep.kernel = o.xattn_estimate;
    ep.gemm = gemm.get();
    ep.scratch = xa_scratch.ptr;
    ep.scratch_bytes = xa_scratch.bytes;
    ep.xa_kv_heads = run.xa_kv_heads.data();
    ep.n_xa_kv_heads = static_cast<int>(run.xa_kv_heads.size());
    xattn_estimate_cuda(ep, st);
    const int nb_call = (t0 + n + sp.block - 1) / sp.block;  // the call's list rows: counts[h * nb_call + qb]
    xattn_add_kept_blocks(xa_counts.as<int32_t>(), Hq, Hkv, nb_call, t0 / sp.block, nb_call, meta_l,
                          xa_kept.as<unsigned long long>(), st);
  }
  HybridAttnParams ap;
  ap.q = q.as<uint16_t>();
  ap.k = kscr.as<uint16_t>();
  ap.v = vscr.as<uint16_t>();
  ap.out = attn.as<uint16_t>();
  ap.T = n, ap.pos0 = t0, ap.n_heads = Hq, ap.n_kv_heads = Hkv, ap.head_dim = hd;
  ap.block = sp.block;
  ap.meta = meta_l;
  ap.xattn = run.lists;
  apply_attention_config(*o.attention, ap);
  hybrid_attention_fwd(ap, st);
  ELASTIC_CUDA_CHECK(cudaEventRecord(ev.second, st));

  // Residual adds fused into the output projections (beta = 1).
  gemm->bf16(attn.as<uint16_t>(), W.wo.as<uint16_t>(), h_rows, n, D, Hq * hd, st, nullptr, 1.f);
  rmsnorm_bf16_stream(h_rows, W.mlp_norm.as<uint16_t>(), xn.as<uint16_t>(), n, D, c.rms_eps, st);
  gemm->bf16(xn.as<uint16_t>(), W.w_gu.as<uint16_t>(), gu.as<uint16_t>(), n, 2 * F, D, st);
  swiglu_bf16(gu.as<uint16_t>(), act.as<uint16_t>(), n, F, st);
  gemm->bf16(act.as<uint16_t>(), W.w_down.as<uint16_t>(), h_rows, n, D, F, st, nullptr, 1.f);

  run.t0 = t0 + n;
  if (run.t0 < T) return false;
  // The layer's keys and values into the pages its routing keeps (waits for the layer).
  store_layer_pages(slots[run.slot], l, modes, sp, T);
  run.t0 = 0;
  run.l = l + 1;
  return run.l == L;
}

void GpuModel::Impl::prefill_end(std::vector<float>* logits_out, bool all_logits, GpuPrefillStats* stats) {
  // GpuModel::prefill_end checked that every layer has run.
  const int D = c.hidden, V = c.vocab, T = run.T;
  cudaStream_t st = stream;
  // Logits: the last row, or every row in pieces of kLogitRows.
  if (logits_out) {
    const int first = all_logits ? 0 : T - 1;
    logits_out->resize(size_t(T - first) * V);
    for (int t0 = first; t0 < T; t0 += kLogitRows) {
      const int n = std::min(kLogitRows, T - t0);
      rmsnorm_bf16_stream(row_ptr(hidden, t0, D), final_norm.as<uint16_t>(), xn.as<uint16_t>(), n, D, c.rms_eps, st);
      gemm->bf16_out_f32(xn.as<uint16_t>(), head_weight(), logits.as<float>(), n, V, D, st);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(logits_out->data() + size_t(t0 - first) * V, logits.ptr, size_t(n) * V * 4,
                                         cudaMemcpyDeviceToHost, st));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
    }
  }
  // The hidden state of the last token seeds nothing: decode starts from the next token's embedding.
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
  double attn_ms = 0;
  for (const auto& e : run.events) {
    float ms = 0;
    ELASTIC_CUDA_CHECK(cudaEventElapsedTime(&ms, e.first, e.second));
    attn_ms += ms;
  }
  Slot& sl = slots[run.slot];
  sl.routing = run.r;
  sl.length = T;
  const auto start = run.start;
  for (auto& e : run.events) {
    cudaEventDestroy(e.first);
    cudaEventDestroy(e.second);
  }
  const int slot = run.slot;
  run = PrefillRun{};
  tables_dirty = true;
  if (stats) {
    stats->total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    stats->attention_ms = attn_ms;
    stats->kv_bytes = bytes_held(slots[slot]);
    unsigned long long kept = 0;  // the stream was synchronized above
    ELASTIC_CUDA_CHECK(cudaMemcpy(&kept, xa_kept.ptr, sizeof(kept), cudaMemcpyDeviceToHost));
    stats->xattn_kept_blocks = static_cast<int64_t>(kept);
  }
}

void GpuModel::prefill_begin(int slot, const int32_t* ids, int T, const RoutingTable* routing,
                             const PromptRouter* router) {
  // The current device is per host thread: a caller on another thread than upload()'s (the server's engine thread)
  // must still run on this model's device.
  ELASTIC_CUDA_CHECK(cudaSetDevice(impl_->o.device));
  Impl& m = *impl_;
  try {
    m.prefill_begin(slot, ids, T, routing, router);  // refuses another slot's running prefill before changing it
  } catch (...) {
    if (m.run.slot == slot) m.abort_prefill();  // a copy or launch that failed after the slot was taken
    throw;
  }
}

bool GpuModel::prefill_step() {
  ELASTIC_CUDA_CHECK(cudaSetDevice(impl_->o.device));
  // Misuse is refused before the try, so it keeps the running prefill.
  if (impl_->run.slot < 0) throw std::logic_error("gpu prefill_step: no prefill is running");
  if (impl_->run.l >= impl_->c.n_layers)
    throw std::logic_error("gpu prefill_step: the prefill has finished (call prefill_end)");
  try {
    return impl_->prefill_advance();
  } catch (...) {
    impl_->abort_prefill();  // never a half-stored sequence; its pages go back
    throw;
  }
}

void GpuModel::prefill_end(std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats) {
  ELASTIC_CUDA_CHECK(cudaSetDevice(impl_->o.device));
  if (impl_->run.slot < 0 || impl_->run.l < impl_->c.n_layers)  // a misuse keeps the running prefill
    throw std::logic_error("gpu prefill_end: the prefill has not finished");
  try {
    impl_->prefill_end(logits, all_logits, stats);
  } catch (...) {
    impl_->abort_prefill();
    throw;
  }
}

int GpuModel::prefilling_slot() const { return impl_->run.slot; }

void GpuModel::fork(int from, int to) {
  Impl& m = *impl_;
  ELASTIC_CUDA_CHECK(cudaSetDevice(m.o.device));
  Impl::Slot& src = m.slot_at(from);
  Impl::Slot& dst = m.slot_at(to);
  if (from == to) throw std::invalid_argument("gpu fork: slot " + std::to_string(from) + " onto itself");
  if (!src.live()) throw std::logic_error("gpu fork: slot " + std::to_string(from) + " holds no sequence");
  if (m.run.slot == from) throw std::logic_error("gpu fork: slot " + std::to_string(from) + "'s prefill is running");
  release(to);
  const int L = m.c.n_layers, n = src.length;
  std::vector<int32_t> from_pages, to_pages;
  try {
    dst.seq.resize(L);
    std::vector<int32_t> a, b;
    for (int l = 0; l < L; ++l) {
      dst.seq[l] = std::make_unique<SequencePages>(*m.pages, src.seq[l]->routing());
      dst.seq[l]->copy_layout_from(*src.seq[l], a, b);
      from_pages.insert(from_pages.end(), a.begin(), a.end());
      to_pages.insert(to_pages.end(), b.begin(), b.end());
    }
  } catch (...) {
    dst.seq.clear();  // the layers copied so far give their pages back
    throw;
  }
  // Through page_map-sized chunks of device memory: the id lists go up in pieces the map buffer holds.
  const size_t cap = m.page_map.bytes / 8;  // pairs per piece (src ids then dst ids in one buffer); >= 1 (init_common)
  for (size_t i = 0; i < from_pages.size(); i += cap) {
    const size_t k = std::min(cap, from_pages.size() - i);
    int32_t* d = m.page_map.as<int32_t>();
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(d, from_pages.data() + i, k * 4, cudaMemcpyHostToDevice, m.stream));
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(d + k, to_pages.data() + i, k * 4, cudaMemcpyHostToDevice, m.stream));
    paged_copy_pages(d, d + k, static_cast<int>(k), Impl::kPageSize, m.c.head_dim, m.k_pool.ptr, m.v_pool.ptr,
                     m.stream);
    ELASTIC_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the next piece overwrites the ids
  }
  dst.routing = src.routing;
  dst.length = n;
  m.tables_dirty = true;
}

void GpuModel::prefill(const int32_t* ids, int T, const RoutingTable* fixed, const PromptRouter* router,
                       std::vector<float>* logits, bool all_logits, GpuPrefillStats* stats) {
  prefill_begin(0, ids, T, fixed, router);
  while (!prefill_step()) {
  }
  prefill_end(logits, all_logits, stats);
}

void GpuModel::Impl::decode_body(int B) {
  const ProgrammaticLaunch pdl(o.programmatic_launch);  // this thread's launches (and their capture) below
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate, V = c.vocab;
  const int N = (Hq + 2 * Hkv) * hd, S = static_cast<int>(slots.size()), MU = max_units(B);
  cudaStream_t st = stream;
  int32_t* io_ids = d_io;         // [B] input ids
  int32_t* io_next = d_io + S;    // [B] greedy next ids
  int32_t* io_pos = d_io + 2 * S; // [B] positions
  uint16_t* x = d_x.as<uint16_t>();
  // RMSNorm of the residual rows x into d_xn (the Norms part), then a product (bf16 out y, or fp32 out yf). `part` is
  // marked after the product (kCount: the caller marks later). Folding the norm into the small-M product gave no
  // measurable gain (docs/PERFORMANCE.md, "One engine: before and after") and was removed.
  auto normed_product = [&](const DeviceBuffer& gamma, const uint16_t* Wt, uint16_t* y, float* yf, int n_out,
                            GpuDecodeParts::Part part) {
    const uint16_t* g = gamma.as<uint16_t>();
    uint16_t* xn = d_xn.as<uint16_t>();
    rmsnorm_bf16_stream(x, g, xn, B, D, c.rms_eps, st);
    mark(GpuDecodeParts::Norms);
    if (yf) gemm->bf16_out_f32(xn, Wt, yf, B, n_out, D, st);
    else gemm->bf16(xn, Wt, y, B, n_out, D, st);
    if (part != GpuDecodeParts::kCount) mark(part);
  };
  mark(GpuDecodeParts::EmbedPlan);  // the start
  embed_rows_bf16(embed.as<uint16_t>(), io_ids, x, B, D, V, st);
  // Every layer's units for this step's kept counts (prepare_step wrote them): a layer's B * Hkv heads at once.
  paged_decode_plan_device(dec_heads, dec_units.as<PagedDecodeUnit>(), dec_n_units.as<int32_t>(), c.n_layers, B * Hkv,
                           MU, target_units, st, o.batch_invariant ? Hkv : 0);
  mark(GpuDecodeParts::EmbedPlan);
  for (int l = 0; l < c.n_layers; ++l) {
    const GpuLayer& W = layers[l];
    const size_t off = size_t(l) * B * Hkv;
    normed_product(W.attn_norm, W.w_qkv.as<uint16_t>(), d_qkv.as<uint16_t>(), nullptr, N, GpuDecodeParts::Qkv);
    QkvPostParams qp;
    qp.qkv = d_qkv.as<uint16_t>();
    qp.bias = W.b_qkv.as<uint16_t>();
    qp.q_norm = W.q_norm.as<uint16_t>();
    qp.k_norm = W.k_norm.as<uint16_t>();
    qp.inv_freq = inv_freq.as<float>();
    qp.eps = c.rms_eps;
    qp.T = B;
    qp.pos_dev = io_pos;  // each sequence at its own position
    qp.n_heads = Hq, qp.n_kv_heads = Hkv, qp.head_dim = hd;
    qp.q_out = d_q.as<uint16_t>();
    qp.k_out = d_k.as<uint16_t>();
    qp.v_out = d_v.as<uint16_t>();
    qp.kv_rows_from_zero = true;
    qkv_post(qp, st);
    // d_k / d_v are [B, Hkv, hd]: B * Hkv rows, each to its head's pool row.
    paged_append(d_k.ptr, d_v.ptr, dec_rows + off, k_pool.ptr, v_pool.ptr, B * Hkv, hd, st);
    mark(GpuDecodeParts::QkvPost);
    PagedDecodeParams pp;
    pp.q = d_q.ptr;
    pp.out = d_attn.ptr;
    pp.k_pool = k_pool.ptr;
    pp.v_pool = v_pool.ptr;
    pp.page_table = page_table.as<int32_t>();
    pp.heads = dec_heads + off;
    pp.units = dec_units.as<PagedDecodeUnit>() + size_t(l) * MU;
    pp.n_units_dev = dec_n_units.as<int32_t>() + l;
    pp.max_units = MU;
    pp.workspace = d_ws.as<float>();
    pp.n_seqs = B, pp.n_heads = Hq, pp.n_kv_heads = Hkv, pp.head_dim = hd, pp.page_size = kPageSize;
    paged_decode_attention(pp, st);
    mark(GpuDecodeParts::Attention);
    if (probe_out) {  // eager, B = 1 (last_row_attention runs a probing step uncaptured); every head is full
      last_row_probs_paged(d_q.ptr, k_pool.ptr, page_table.as<int32_t>(), dec_heads + off, Hq, Hkv, hd, kPageSize,
                           probe_n_pos, probe_probs.as<float>(), st);
      std::vector<float>& dst = (*probe_out)[l];
      dst.resize(size_t(Hq) * probe_n_pos);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dst.data(), probe_probs.ptr, dst.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, st));
    }
    gemm->bf16(d_attn.as<uint16_t>(), W.wo.as<uint16_t>(), x, B, D, Hq * hd, st, nullptr, 1.f);
    mark(GpuDecodeParts::OProj);
    normed_product(W.mlp_norm, W.w_gu.as<uint16_t>(), d_gu.as<uint16_t>(), nullptr, 2 * F, GpuDecodeParts::kCount);
    swiglu_bf16(d_gu.as<uint16_t>(), d_act.as<uint16_t>(), B, F, st);
    gemm->bf16(d_act.as<uint16_t>(), W.w_down.as<uint16_t>(), x, B, D, F, st, nullptr, 1.f);
    mark(GpuDecodeParts::Mlp);
  }
  normed_product(final_norm, head_weight(), nullptr, logits.as<float>(), V, GpuDecodeParts::kCount);
  argmax_rows_f32(logits.as<float>(), B, V, io_next, st);
  mark(GpuDecodeParts::Logits);
}

void GpuModel::Impl::mark(Part p) {
  if (!part_marks) return;
  // Events come from part_events, made before the step, so no host call sits between two launches but the record.
  if (part_marks->size() >= part_events.size()) throw std::logic_error("decode_parts: more parts than events");
  const cudaEvent_t e = part_events[part_marks->size()];
  part_marks->emplace_back(p, e);
  ELASTIC_CUDA_CHECK(cudaEventRecord(e, stream));
}

void GpuModel::decode_batch(const std::vector<int>& batch, const std::vector<int32_t>& ids,
                            std::vector<float>* logits_out, std::vector<int32_t>* next) {
  Impl& m = *impl_;
  ELASTIC_CUDA_CHECK(cudaSetDevice(m.o.device));  // see prefill_begin
  const int B = static_cast<int>(batch.size());
  if (B == 0) throw std::invalid_argument("gpu decode: empty batch");
  if (ids.size() != batch.size()) throw std::invalid_argument("gpu decode: one id per slot");
  std::vector<uint8_t> seen(m.slots.size(), 0);
  for (int b = 0; b < B; ++b) {  // every check before any sequence changes
    const int s = batch[b];
    Impl::Slot& sl = m.slot_at(s);
    if (seen[s]++) throw std::invalid_argument("gpu decode: slot " + std::to_string(s) + " appears twice in the batch");
    if (!sl.live()) throw std::logic_error("gpu decode: slot " + std::to_string(s) + " holds no sequence (prefill first)");
    if (sl.length >= m.o.max_ctx)
      throw std::invalid_argument("gpu decode: slot " + std::to_string(s) + "'s sequence is full (" +
                                  std::to_string(m.o.max_ctx) + " positions)");
    if (ids[b] < 0 || ids[b] >= m.c.vocab)
      throw std::invalid_argument("gpu decode: token id " + std::to_string(ids[b]) + " is outside the vocabulary");
  }
  cudaStream_t st = m.stream;
  m.prepare_step(batch, ids);
  cudaGraphExec_t& graph = m.graphs[B];
  if (m.probe_out || m.part_marks) {
    m.decode_body(B);
  } else if (graph) {
    ELASTIC_CUDA_CHECK(cudaGraphLaunch(graph, st));
  } else if (m.o.graphs && m.eager_steps[B] > 0) {
    // Captured after one eager step of this size, so cuBLASLt has picked its algorithms (no host work while
    // capturing).
    cudaGraph_t g = nullptr;
    ELASTIC_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    try {
      m.decode_body(B);
    } catch (...) {
      cudaStreamEndCapture(st, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    ELASTIC_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    ELASTIC_CUDA_CHECK(cudaGraphInstantiate(&graph, g, 0));
    cudaGraphDestroy(g);
    ELASTIC_CUDA_CHECK(cudaGraphLaunch(graph, st));
  } else {
    m.decode_body(B);
    ++m.eager_steps[B];
  }
  const int S = static_cast<int>(m.slots.size());
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(m.h_next.data(), m.d_io + S, size_t(B) * 4, cudaMemcpyDeviceToHost, st));
  if (logits_out) {
    logits_out->resize(size_t(B) * m.c.vocab);
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(logits_out->data(), m.logits.ptr, size_t(B) * m.c.vocab * 4,
                                       cudaMemcpyDeviceToHost, st));
  }
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
  for (int s : batch) ++m.slots[s].length;
  if (next) next->assign(m.h_next.begin(), m.h_next.begin() + B);
}

int32_t GpuModel::decode(int32_t id, std::vector<float>* logits_out) {
  std::vector<int32_t> next;
  decode_batch({0}, {id}, logits_out, &next);
  return next[0];
}

std::vector<std::vector<float>> GpuModel::last_row_attention(const std::vector<int32_t>& ids) {
  Impl& m = *impl_;
  const int T = static_cast<int>(ids.size());
  if (T < 2 || T > m.o.max_ctx)
    throw std::invalid_argument("gpu last_row_attention: needs 2 to " + std::to_string(m.o.max_ctx) +
                                " ids (got " + std::to_string(T) + ")");
  prefill(ids.data(), T - 1, nullptr, nullptr, nullptr, false);  // no routing, no router: every head full
  const size_t need = size_t(m.c.n_heads) * T * sizeof(float);
  if (m.probe_probs.bytes < need) m.probe_probs.alloc(need);
  std::vector<std::vector<float>> probs(m.c.n_layers);
  m.probe_out = &probs;
  m.probe_n_pos = T;  // the step attends every position, its own included
  try {
    decode(ids[T - 1]);
  } catch (...) {
    m.probe_out = nullptr;
    throw;
  }
  m.probe_out = nullptr;
  return probs;
}

GpuDecodeParts GpuModel::decode_parts(int32_t id, int32_t* next, int batch) {
  Impl& m = *impl_;
  if (batch < 1 || batch > static_cast<int>(m.slots.size()))
    throw std::invalid_argument("decode_parts: batch must be in [1, " + std::to_string(m.slots.size()) + "]");
  std::vector<int> bs(batch);
  for (int b = 0; b < batch; ++b) bs[b] = b;
  std::vector<std::pair<Impl::Part, cudaEvent_t>> marks;
  m.part_events.assign(size_t(8) * m.c.n_layers + 8, nullptr);  // 7 marks per layer and 4 around them
  for (cudaEvent_t& e : m.part_events) ELASTIC_CUDA_CHECK(cudaEventCreate(&e));
  m.part_marks = &marks;
  GpuDecodeParts parts;
  try {
    std::vector<int32_t> nx;
    decode_batch(bs, std::vector<int32_t>(batch, id), nullptr, &nx);  // synchronizes: every event has completed
    if (next) *next = nx[0];
    for (size_t i = 1; i < marks.size(); ++i) {  // each interval belongs to the part that closes it
      float ms = 0;
      ELASTIC_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
      parts.ms[marks[i].first] += ms;
    }
  } catch (...) {
    m.part_marks = nullptr;
    for (cudaEvent_t e : m.part_events) cudaEventDestroy(e);
    m.part_events.clear();
    throw;
  }
  m.part_marks = nullptr;
  for (cudaEvent_t e : m.part_events) cudaEventDestroy(e);
  m.part_events.clear();
  return parts;
}

}  // namespace elastic::cuda
