// GpuModel's forward passes: layer-major routed prefill into paged per-head KV memory, and decode steps replayed
// through one CUDA graph per sequence.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda/gpu_model_impl.h"
#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"

namespace elastic::cuda {
namespace {

uint16_t* row_ptr(const DeviceBuffer& b, size_t row, size_t width) { return b.as<uint16_t>() + row * width; }

// The routing's sparse settings as the kernels read them.
KVHeadMeta meta_for(HeadMode m, const SparseSettings& s) {
  return make_kv_head_meta(m, s.sink, s.local, s.block);  // refuses a pattern the kernels do not implement
}

struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
};

}  // namespace

void GpuModel::Impl::store_layer_pages(int l, const HeadMode* modes, const SparseSettings& s, int T) {
  const int Hkv = c.n_kv_heads, hd = c.head_dim, P = kPageSize;
  RoutingTable lr = RoutingTable::all_full(1, Hkv);
  std::copy(modes, modes + Hkv, lr.mode.begin());
  lr.sparse = s;
  seq[l] = std::make_unique<SequencePages>(*pages, lr);
  // A block at a time, returning what leaves a streaming head's window, so the pool never holds more of a head than
  // its window plus a block; what is left is what the first decode step attends.
  for (int c0 = 0; c0 < T; c0 += s.block) {
    seq[l]->grow(std::min(T, c0 + s.block));
    seq[l]->release_unused();
  }
  // Position page j of head h -> its pool page (or -1): the pages of a block are consecutive, in position order.
  const int n_pp = (T + P - 1) / P;
  std::vector<int32_t> map(size_t(Hkv) * pages_per_head, -1);
  for (int h = 0; h < Hkv; ++h) {
    const HeadPages& hp = seq[l]->head(0, h);
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
  h_offsets.assign(size_t(c.n_layers) * Hkv, 0);
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < Hkv; ++h) {
      const HeadPages& hp = seq[l]->head(0, h);
      h_offsets[size_t(l) * Hkv + h] = static_cast<int32_t>(h_table.size());
      h_table.insert(h_table.end(), hp.pages.begin(), hp.pages.end());
    }
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(page_table.ptr, h_table.data(), h_table.size() * 4, cudaMemcpyHostToDevice, stream));
  tables_dirty = false;
}

void GpuModel::Impl::prepare_step(int32_t id) {
  const int Hkv = c.n_kv_heads, n = length;
  // The previous step has finished (decode waits for it), so pages that left a window can be handed out again; a
  // block leaves a window only when a new block starts. A step retried after a failure finds its pages grown.
  for (int l = 0; l < c.n_layers; ++l) {
    if (seq[l]->length() == n + 1) continue;
    if (n % seq[l]->routing().sparse.block == 0) seq[l]->release_unused();
    seq[l]->grow(n + 1);
  }
  if (n % kPageSize == 0) tables_dirty = true;  // a new page per head; a streaming head's window moved a block
  if (tables_dirty) upload_tables();
  const int32_t io[4] = {id, 0, n, n + 1};
  std::memcpy(h_step.data(), io, 16);
  auto* heads = reinterpret_cast<PagedDecodeHead*>(h_step.data() + 16);
  auto* rows = reinterpret_cast<int64_t*>(h_step.data() + 16 + size_t(c.n_layers) * Hkv * sizeof(PagedDecodeHead));
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < Hkv; ++h) {
      const size_t i = size_t(l) * Hkv + h;
      heads[i] = PagedDecodeHead{h_offsets[i], seq[l]->head(0, h).kept, 0, 0};
      rows[i] = seq[l]->row(0, h, n);
    }
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(d_step.ptr, h_step.data(), h_step.size(), cudaMemcpyHostToDevice, stream));
}

void GpuModel::prefill(const int32_t* ids_h, int T, const RoutingTable* fixed, const PromptRouter* router,
                       std::vector<float>* logits_out, bool all_logits, GpuPrefillStats* stats) {
  Impl& m = *impl_;
  // The current device is per host thread: a caller on another thread than upload()'s (the server's engine thread)
  // must still run on this model's device.
  ELASTIC_CUDA_CHECK(cudaSetDevice(m.o.device));
  const ModelConfig& c = m.c;
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate, V = c.vocab;
  const int N = (Hq + 2 * Hkv) * hd, L = c.n_layers;
  if (T <= 0) throw std::invalid_argument("gpu prefill: empty prompt");
  if (T > m.o.max_ctx)
    throw std::invalid_argument("gpu prefill: prompt of " + std::to_string(T) + " tokens exceeds the plan's " +
                                std::to_string(m.o.max_ctx) + " positions");
  for (int t = 0; t < T; ++t)
    if (ids_h[t] < 0 || ids_h[t] >= V)
      throw std::invalid_argument("gpu prefill: token id " + std::to_string(ids_h[t]) + " at position " +
                                  std::to_string(t) + " is outside the vocabulary of " + std::to_string(V));
  if (fixed && (fixed->n_layers != L || fixed->n_kv_heads != Hkv))
    throw std::invalid_argument("gpu prefill: the routing table's layer/head counts do not match the model");
  const auto t_start = std::chrono::steady_clock::now();
  m.drop_graph();
  m.length = 0;
  m.seq.clear();  // the previous sequence's pages back to the pool
  m.seq.resize(L);
  m.tables_dirty = true;

  RoutingTable r = fixed ? *fixed : RoutingTable::all_full(L, Hkv);
  if (!fixed && router) r.sparse = router->sparse();
  const SparseSettings& sp = r.sparse;
  validate_sparse(sp, "gpu prefill");
  const int chunk = m.chunk;
  cudaStream_t st = m.stream;

  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(m.ids.ptr, ids_h, size_t(T) * 4, cudaMemcpyHostToDevice, st));
  embed_rows_bf16(m.embed.as<uint16_t>(), m.ids.as<int32_t>(), m.hidden.as<uint16_t>(), T, D, V, st);

  std::vector<EventPair> events;
  auto new_pair = [&] {
    EventPair e;
    ELASTIC_CUDA_CHECK(cudaEventCreate(&e.a));
    ELASTIC_CUDA_CHECK(cudaEventCreate(&e.b));
    events.push_back(e);
    return e;
  };
  const std::vector<int> pool_pos = router && !fixed ? boundary_positions(T, router->pool_first(), router->pool_last())
                                                     : std::vector<int>{};
  std::vector<float> pooled(size_t(Hkv) * hd);
  std::vector<KVHeadMeta> meta_h(Hkv);

  QkvPostParams qp;
  qp.eps = c.rms_eps;
  qp.inv_freq = m.inv_freq.as<float>();
  qp.n_heads = Hq, qp.n_kv_heads = Hkv, qp.head_dim = hd;
  qp.q_out = m.q.as<uint16_t>();
  qp.k_out = m.kscr.as<uint16_t>();
  qp.v_out = m.vscr.as<uint16_t>();

  for (int l = 0; l < L; ++l) {
    const GpuLayer& W = m.layers[l];
    qp.bias = W.b_qkv.as<uint16_t>();
    qp.q_norm = W.q_norm.as<uint16_t>();
    qp.k_norm = W.k_norm.as<uint16_t>();
    HeadMode* modes = r.mode.data() + size_t(l) * Hkv;

    if (!pool_pos.empty()) {
      // Route this layer from the boundary rows' keys (after k_norm, before RoPE), before any of its attention.
      const int nb = static_cast<int>(pool_pos.size());
      if (nb > chunk) throw std::invalid_argument("gpu prefill: the chunk is smaller than the router's pool");
      // pool_pos is two ascending runs: copy each contiguous run of rows.
      for (int i = 0; i < nb;) {
        int j = i + 1;
        while (j < nb && pool_pos[j] == pool_pos[j - 1] + 1) ++j;
        rmsnorm_bf16_stream(row_ptr(m.hidden, pool_pos[i], D), W.attn_norm.as<uint16_t>(), row_ptr(m.xn, i, D),
                            j - i, D, c.rms_eps, st);
        i = j;
      }
      m.gemm->bf16(m.xn.as<uint16_t>(), W.w_qkv.as<uint16_t>(), m.qkv.as<uint16_t>(), nb, N, D, st);
      ELASTIC_CUDA_CHECK(cudaMemsetAsync(m.pool.ptr, 0, m.pool.bytes, st));
      QkvPostParams pp = qp;
      pp.qkv = m.qkv.as<uint16_t>();
      pp.T = nb;
      pp.pos0 = 0;
      pp.pool_sum = m.pool.as<float>();
      pp.pool_first_end = nb;  // every row of this call is a pool row
      pp.pool_last_begin = nb;
      qkv_post(pp, st);  // q/k/v rows written here are scratch: the layer's pass below overwrites them
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(pooled.data(), m.pool.ptr, m.pool.bytes, cudaMemcpyDeviceToHost, st));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
      for (float& x : pooled) x /= nb;
      router->decide(l, pooled.data(), modes);
    }
    bool has_xattn = false;
    for (int h = 0; h < Hkv; ++h) {
      meta_h[h] = meta_for(modes[h], sp);
      has_xattn |= modes[h] == HeadMode::XAttn;
    }
    KVHeadMeta* meta_l = m.meta.as<KVHeadMeta>() + size_t(l) * Hkv;
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(meta_l, meta_h.data(), Hkv * sizeof(KVHeadMeta), cudaMemcpyHostToDevice, st));
    XAttnBlockLists lists;
    if (has_xattn) {
      if (T > chunk && chunk % sp.block)
        throw std::invalid_argument("gpu prefill: XAttention heads need a chunk size that is a multiple of the block (" +
                                    std::to_string(chunk) + " vs " + std::to_string(sp.block) + ")");
      const int nbk = (m.o.max_ctx + sp.block - 1) / sp.block;
      if (m.xa_block != sp.block) {
        m.xa_blocks.alloc(size_t(xattn_list_capacity(Hq, nbk)) * 4);
        m.xa_offsets.alloc(size_t(Hq) * nbk * 4);
        m.xa_counts.alloc(size_t(Hq) * nbk * 4);
        m.xa_block = sp.block;
      }
      lists.blocks = m.xa_blocks.as<int32_t>();
      lists.offsets = m.xa_offsets.as<int32_t>();
      lists.counts = m.xa_counts.as<int32_t>();
    }

    for (int t0 = 0; t0 < T; t0 += chunk) {
      const int n = std::min(chunk, T - t0);
      uint16_t* h_rows = row_ptr(m.hidden, t0, D);
      rmsnorm_bf16_stream(h_rows, W.attn_norm.as<uint16_t>(), m.xn.as<uint16_t>(), n, D, c.rms_eps, st);
      m.gemm->bf16(m.xn.as<uint16_t>(), W.w_qkv.as<uint16_t>(), m.qkv.as<uint16_t>(), n, N, D, st);
      QkvPostParams pp = qp;
      pp.qkv = m.qkv.as<uint16_t>();
      pp.T = n;
      pp.pos0 = t0;
      qkv_post(pp, st);

      const EventPair ev = new_pair();
      ELASTIC_CUDA_CHECK(cudaEventRecord(ev.a, st));
      if (has_xattn) {
        XAttnEstimateParams ep;
        ep.q = m.q.as<uint16_t>();
        ep.k = m.kscr.as<uint16_t>();
        ep.T = n, ep.pos0 = t0, ep.n_heads = Hq, ep.n_kv_heads = Hkv, ep.head_dim = hd;
        ep.block = sp.block, ep.stride = sp.xattn.stride, ep.tau = sp.xattn.tau;
        ep.meta = meta_l;
        ep.blocks = m.xa_blocks.as<int32_t>();
        ep.offsets = m.xa_offsets.as<int32_t>();
        ep.counts = m.xa_counts.as<int32_t>();
        xattn_estimate_cuda(ep, st);
      }
      HybridAttnParams ap;
      ap.q = m.q.as<uint16_t>();
      ap.k = m.kscr.as<uint16_t>();
      ap.v = m.vscr.as<uint16_t>();
      ap.out = m.attn.as<uint16_t>();
      ap.T = n, ap.pos0 = t0, ap.n_heads = Hq, ap.n_kv_heads = Hkv, ap.head_dim = hd;
      ap.block = sp.block;
      ap.meta = meta_l;
      ap.xattn = lists;
      apply_attention_config(*m.o.attention, ap);
      hybrid_attention_fwd(ap, st);
      ELASTIC_CUDA_CHECK(cudaEventRecord(ev.b, st));

      // Residual adds fused into the output projections (beta = 1).
      m.gemm->bf16(m.attn.as<uint16_t>(), W.wo.as<uint16_t>(), h_rows, n, D, Hq * hd, st, nullptr, 1.f);
      rmsnorm_bf16_stream(h_rows, W.mlp_norm.as<uint16_t>(), m.xn.as<uint16_t>(), n, D, c.rms_eps, st);
      m.gemm->bf16(m.xn.as<uint16_t>(), W.w_gu.as<uint16_t>(), m.gu.as<uint16_t>(), n, 2 * F, D, st);
      swiglu_bf16(m.gu.as<uint16_t>(), m.act.as<uint16_t>(), n, F, st);
      m.gemm->bf16(m.act.as<uint16_t>(), W.w_down.as<uint16_t>(), h_rows, n, D, F, st, nullptr, 1.f);
    }
    // The layer's keys and values into the pages its routing keeps.
    m.store_layer_pages(l, modes, sp, T);
  }

  // Logits: the last row, or every row in pieces of kLogitRows.
  if (logits_out) {
    const int first = all_logits ? 0 : T - 1;
    logits_out->resize(size_t(T - first) * V);
    for (int t0 = first; t0 < T; t0 += Impl::kLogitRows) {
      const int n = std::min(Impl::kLogitRows, T - t0);
      rmsnorm_bf16_stream(row_ptr(m.hidden, t0, D), m.final_norm.as<uint16_t>(), m.xn.as<uint16_t>(), n, D,
                          c.rms_eps, st);
      m.gemm->bf16_out_f32(m.xn.as<uint16_t>(), m.head_weight(), m.logits.as<float>(), n, V, D, st);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(logits_out->data() + size_t(t0 - first) * V, m.logits.ptr,
                                         size_t(n) * V * 4, cudaMemcpyDeviceToHost, st));
      ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
    }
  }
  // The hidden state of the last token seeds nothing: decode starts from the next token's embedding.
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
  double attn_ms = 0;
  for (const EventPair& e : events) {
    float ms = 0;
    ELASTIC_CUDA_CHECK(cudaEventElapsedTime(&ms, e.a, e.b));
    attn_ms += ms;
    cudaEventDestroy(e.a);
    cudaEventDestroy(e.b);
  }
  m.routing = r;
  m.length = T;
  if (stats) {
    stats->total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    stats->attention_ms = attn_ms;
    stats->kv_bytes = kv_bytes();
  }
}

void GpuModel::Impl::decode_body() {
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate, V = c.vocab;
  const int N = (Hq + 2 * Hkv) * hd;
  cudaStream_t st = stream;
  int32_t* io = d_io;  // [input id, next id, pos, n_pos]
  uint16_t* x = d_x.as<uint16_t>();
  mark(GpuDecodeParts::EmbedPlan);  // the start
  embed_rows_bf16(embed.as<uint16_t>(), io, x, 1, D, V, st);
  // Every layer's units for this step's kept counts (prepare_step wrote them).
  paged_decode_plan_device(dec_heads, dec_units.as<PagedDecodeUnit>(), dec_n_units.as<int32_t>(), c.n_layers, Hkv,
                           max_units, target_units, st);
  mark(GpuDecodeParts::EmbedPlan);
  for (int l = 0; l < c.n_layers; ++l) {
    const GpuLayer& W = layers[l];
    const size_t off = size_t(l) * Hkv;
    rmsnorm_bf16_stream(x, W.attn_norm.as<uint16_t>(), d_xn.as<uint16_t>(), 1, D, c.rms_eps, st);
    mark(GpuDecodeParts::Norms);
    gemm->bf16(d_xn.as<uint16_t>(), W.w_qkv.as<uint16_t>(), d_qkv.as<uint16_t>(), 1, N, D, st);
    mark(GpuDecodeParts::Qkv);
    QkvPostParams qp;
    qp.qkv = d_qkv.as<uint16_t>();
    qp.bias = W.b_qkv.as<uint16_t>();
    qp.q_norm = W.q_norm.as<uint16_t>();
    qp.k_norm = W.k_norm.as<uint16_t>();
    qp.inv_freq = inv_freq.as<float>();
    qp.eps = c.rms_eps;
    qp.T = 1;
    qp.pos0_dev = io + 2;
    qp.n_heads = Hq, qp.n_kv_heads = Hkv, qp.head_dim = hd;
    qp.q_out = d_q.as<uint16_t>();
    qp.k_out = d_k.as<uint16_t>();
    qp.v_out = d_v.as<uint16_t>();
    qp.kv_rows_from_zero = true;
    qkv_post(qp, st);
    paged_append(d_k.ptr, d_v.ptr, dec_rows + off, k_pool.ptr, v_pool.ptr, Hkv, hd, st);
    mark(GpuDecodeParts::QkvPost);
    PagedDecodeParams pp;
    pp.q = d_q.ptr;
    pp.out = d_attn.ptr;
    pp.k_pool = k_pool.ptr;
    pp.v_pool = v_pool.ptr;
    pp.page_table = page_table.as<int32_t>();
    pp.heads = dec_heads + off;
    pp.units = dec_units.as<PagedDecodeUnit>() + size_t(l) * max_units;
    pp.n_units_dev = dec_n_units.as<int32_t>() + l;
    pp.max_units = max_units;
    pp.workspace = d_ws.as<float>();
    pp.n_seqs = 1, pp.n_heads = Hq, pp.n_kv_heads = Hkv, pp.head_dim = hd, pp.page_size = kPageSize;
    paged_decode_attention(pp, st);
    mark(GpuDecodeParts::Attention);
    if (probe_out) {  // eager (decode() runs a probing step uncaptured); every head is full, so n_pos = kept
      const int n_pos = length + 1;
      last_row_probs_paged(d_q.ptr, k_pool.ptr, page_table.as<int32_t>(), dec_heads + off, Hq, Hkv, hd, kPageSize,
                           n_pos, probe_probs.as<float>(), st);
      std::vector<float>& dst = (*probe_out)[l];
      dst.resize(size_t(Hq) * n_pos);
      ELASTIC_CUDA_CHECK(cudaMemcpyAsync(dst.data(), probe_probs.ptr, dst.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, st));
    }
    gemm->bf16(d_attn.as<uint16_t>(), W.wo.as<uint16_t>(), x, 1, D, Hq * hd, st, nullptr, 1.f);
    mark(GpuDecodeParts::OProj);
    rmsnorm_bf16_stream(x, W.mlp_norm.as<uint16_t>(), d_xn.as<uint16_t>(), 1, D, c.rms_eps, st);
    mark(GpuDecodeParts::Norms);
    gemm->bf16(d_xn.as<uint16_t>(), W.w_gu.as<uint16_t>(), d_gu.as<uint16_t>(), 1, 2 * F, D, st);
    swiglu_bf16(d_gu.as<uint16_t>(), d_act.as<uint16_t>(), 1, F, st);
    gemm->bf16(d_act.as<uint16_t>(), W.w_down.as<uint16_t>(), x, 1, D, F, st, nullptr, 1.f);
    mark(GpuDecodeParts::Mlp);
  }
  rmsnorm_bf16_stream(x, final_norm.as<uint16_t>(), d_xn.as<uint16_t>(), 1, D, c.rms_eps, st);
  mark(GpuDecodeParts::Norms);
  gemm->bf16_out_f32(d_xn.as<uint16_t>(), head_weight(), logits.as<float>(), 1, V, D, st);
  argmax_rows_f32(logits.as<float>(), 1, V, io + 1, st);
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

int32_t GpuModel::decode(int32_t id, std::vector<float>* logits_out) {
  Impl& m = *impl_;
  ELASTIC_CUDA_CHECK(cudaSetDevice(m.o.device));  // see prefill
  if (m.length == 0) throw std::logic_error("gpu decode: no sequence (prefill first)");
  if (m.length >= m.o.max_ctx)
    throw std::invalid_argument("gpu decode: the sequence is full (" + std::to_string(m.o.max_ctx) + " positions)");
  if (id < 0 || id >= m.c.vocab) throw std::invalid_argument("gpu decode: token id " + std::to_string(id) + " is outside the vocabulary");
  cudaStream_t st = m.stream;
  m.prepare_step(id);
  if (m.probe_out || m.part_marks) {
    m.decode_body();
  } else if (m.graph) {
    ELASTIC_CUDA_CHECK(cudaGraphLaunch(m.graph, st));
  } else if (m.o.graphs && m.eager_steps > 0) {
    // Captured after one eager step, so cuBLASLt has picked its algorithms (no host work while capturing).
    cudaGraph_t g = nullptr;
    ELASTIC_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    try {
      m.decode_body();
    } catch (...) {
      cudaStreamEndCapture(st, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    ELASTIC_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    ELASTIC_CUDA_CHECK(cudaGraphInstantiate(&m.graph, g, 0));
    cudaGraphDestroy(g);
    ELASTIC_CUDA_CHECK(cudaGraphLaunch(m.graph, st));
  } else {
    m.decode_body();
    ++m.eager_steps;
  }
  ELASTIC_CUDA_CHECK(cudaMemcpyAsync(&m.h_next, m.d_io + 1, 4, cudaMemcpyDeviceToHost, st));
  if (logits_out) {
    logits_out->resize(m.c.vocab);
    ELASTIC_CUDA_CHECK(cudaMemcpyAsync(logits_out->data(), m.logits.ptr, size_t(m.c.vocab) * 4,
                                       cudaMemcpyDeviceToHost, st));
  }
  ELASTIC_CUDA_CHECK(cudaStreamSynchronize(st));
  ++m.length;
  return m.h_next;
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
  try {
    decode(ids[T - 1]);
  } catch (...) {
    m.probe_out = nullptr;
    throw;
  }
  m.probe_out = nullptr;
  return probs;
}

GpuDecodeParts GpuModel::decode_parts(int32_t id, int32_t* next) {
  Impl& m = *impl_;
  std::vector<std::pair<Impl::Part, cudaEvent_t>> marks;
  m.part_events.assign(size_t(8) * m.c.n_layers + 8, nullptr);  // 7 marks per layer and 4 around them
  for (cudaEvent_t& e : m.part_events) ELASTIC_CUDA_CHECK(cudaEventCreate(&e));
  m.part_marks = &marks;
  GpuDecodeParts parts;
  try {
    const int32_t t = decode(id);  // synchronizes: every event has completed
    if (next) *next = t;
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
