// GpuModel construction: bf16 weights on the device (uploaded from a CPU model, or random for speed runs), the
// allocation plan and the work buffers it sizes.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "cuda/gpu_model_impl.h"
#include "elastic/cuda.h"
#include "elastic/cuda_ops.h"
#include "model/ops.h"

namespace elastic::cuda {
namespace {

size_t bf16s(size_t n) { return n * 2; }

DeviceBuffer upload_bf16(const std::vector<float>& v) {
  DeviceBuffer b(bf16s(v.size()));
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  ELASTIC_CUDA_CHECK(cudaMemcpy(b.ptr, h.data(), b.bytes, cudaMemcpyHostToDevice));
  return b;
}

// Row-wise concatenation of [rows_i, cols] vectors (fused biases).
std::vector<float> concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// A weight matrix in any CPU format, widened to fp32 one matrix at a time, then rounded to bf16.
DeviceBuffer upload_bf16(const WeightMatrix& m) { return upload_bf16(m.to_f32()); }

// Row-wise concatenation of [rows_i, cols] matrices (fused projections), widened to fp32.
std::vector<float> concat(std::initializer_list<const WeightMatrix*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) {
    const std::vector<float> v = p->to_f32();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void check_shape(const ModelConfig& c) {
  if (c.head_dim != 64 && c.head_dim != 128)
    throw std::invalid_argument("gpu: head_dim " + std::to_string(c.head_dim) +
                                " is not supported by the CUDA attention kernels (64 or 128)");
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads)
    throw std::invalid_argument("gpu: n_heads must be a multiple of n_kv_heads");
  if (c.n_heads / c.n_kv_heads > 16) throw std::invalid_argument("gpu: more than 16 query heads per KV head");
}

}  // namespace

std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", b / double(1ull << 30));
  return s;
}

std::string GpuPlan::describe() const {
  std::ostringstream s;
  s << "gpu plan: weights " << gib(weights) << " | kv page pool (" << slots << (slots == 1 ? " slot) " : " slots) ")
    << gib(kv_pool) << " | prefill k/v "
    << gib(prefill_kv) << " | activations " << gib(activations) << " | xattn lists + scratch " << gib(xattn)
    << " | workspace " << gib(workspace) << " | total " << gib(total());
  if (!kernels.empty()) s << "\nkernels: " << kernels;
  return s.str();
}

GpuModel::Impl::~Impl() {
  abort_prefill();
  drop_graphs();
  slots.clear();  // SequencePages give their pages back before the pool goes
  if (stream) cudaStreamDestroy(stream);
}

void GpuModel::Impl::drop_graphs() {
  for (cudaGraphExec_t& g : graphs)
    if (g) cudaGraphExecDestroy(g), g = nullptr;
  std::fill(eager_steps.begin(), eager_steps.end(), 0);
}

void GpuModel::Impl::init_common() {
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate, V = c.vocab;
  const int N = (Hq + 2 * Hkv) * hd;
  if (o.max_ctx <= 0) throw std::invalid_argument("gpu: max_ctx must be positive");
  if (o.chunk <= 0) throw std::invalid_argument("gpu: chunk must be positive");
  chunk = std::min(o.chunk, o.max_ctx);
  const size_t ctx = o.max_ctx;
  ELASTIC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm = std::make_unique<Gemm>();
  gemm->set_small_m_rows(o.small_m_rows);  // throws outside 0..kSmallMMaxRows
  // Batch invariance pins one cuBLASLt algorithm for every batch size, which the Gemm then runs for every M (the
  // small-M kernel's rows would not match it past its rows); the plan says which runs.
  if (o.batch_invariant) gemm->pin_rows(std::max(o.slots, 1));  // decode's M <= slots; prefill's chunks are larger

  // The plan, before allocating, so a plan that cannot fit fails with its numbers.
  plan.weights = bytes();
  static_assert(kLogitRows >= kMaxGpuSlots && kPagedPlanMaxSeqs >= kMaxGpuSlots,
                "a decode step's logits rows and the planner's per-sequence cuts hold every slot");
  if (o.slots < 1 || o.slots > kMaxGpuSlots)
    throw std::invalid_argument("gpu: slots must be in [1, " + std::to_string(kMaxGpuSlots) + "], got " +
                                std::to_string(o.slots));
  const int S = o.slots;
  plan.slots = S;
  pages_per_head = static_cast<int>((ctx + kPageSize - 1) / kPageSize);
  const int64_t full_pages = int64_t(S) * c.n_layers * Hkv * pages_per_head;  // every slot's heads full at max_ctx
  const int64_t n_pages = o.kv_pool_bytes ? int64_t(o.kv_pool_bytes / (page_bytes() * 2)) : full_pages;
  if (n_pages < 1)
    throw std::invalid_argument("gpu: a KV pool of " + std::to_string(o.kv_pool_bytes) + " bytes holds no page (one " +
                                "page of K and V is " + std::to_string(page_bytes() * 2) + " bytes)");
  if (n_pages > INT32_MAX) throw std::invalid_argument("gpu: the KV pool has more pages than int32 page ids allow");
  plan.kv_pool = size_t(n_pages) * page_bytes() * 2;  // the K and V pools
  target_units = paged_target_units();
  if (!o.attention) o.attention = attention_config_from_env();  // read once: no launch reads the environment
  if (o.xattn_estimate == XAttnEstimateKernel::Auto) o.xattn_estimate = XAttnEstimateKernel::Gemm;  // as the kernel
  const bool fused_estimate = o.xattn_estimate == XAttnEstimateKernel::Fused;
  if (!fused_estimate && o.xattn_estimate != XAttnEstimateKernel::Gemm)
    throw std::invalid_argument("gpu: the XAttention estimator must be the Gemm (cuBLASLt) or the Fused form; the "
                                "others are dev-area measurement variants");
  // Programmatic launches captured into graphs need a driver of CUDA 12.3 or later (programmatic graph edges); an
  // older driver decodes with plain launches, and the plan says so.
  int driver = 0;
  ELASTIC_CUDA_CHECK(cudaDriverGetVersion(&driver));
  const bool pdl_too_old = o.programmatic_launch && driver < 12030;
  if (pdl_too_old) o.programmatic_launch = false;
  plan.kernels = "attention " + describe_attention(*o.attention, Hq, Hkv) + "; decode " + describe_paged_decode() +
                 (o.batch_invariant ? ", batch-invariant (GEMM algorithms pinned to " + std::to_string(o.slots) +
                                          " rows, units cut per sequence)"
                                    : "") +
                 "; projections " + (gemm->pinned_rows() > 0 ? std::string("cuBLASLt (pinned)")
                                     : gemm->small_m_rows() > 0
                                         ? "small-M kernel up to " + std::to_string(gemm->small_m_rows()) +
                                               " rows, cuBLASLt above"
                                         : std::string("cuBLASLt")) +
                 (o.programmatic_launch ? "; decode launches programmatic (PDL)"
                  : pdl_too_old ? "; decode launches plain (driver " + std::to_string(driver / 1000) + "." +
                                      std::to_string(driver % 1000 / 10) + " predates programmatic launch in graphs)"
                                : std::string("; decode launches plain")) +
                 (fused_estimate ? "; XAttention estimate fused wgmma (candidate)" : "; XAttention estimate cuBLASLt");
  const int mu = max_units(S);  // max_units grows with the batch: S's covers every batch size
  const size_t dec_ws = size_t(paged_decode_workspace_floats(mu, Hq / Hkv, hd)) * 4;
  const size_t step_heads = size_t(c.n_layers) * S * Hkv;
  rows_offset = size_t(16) * S + step_heads * sizeof(PagedDecodeHead);  // a multiple of 8
  const size_t step_bytes = rows_offset + step_heads * sizeof(int64_t);
  const size_t tables = size_t(n_pages + int64_t(Hkv) * pages_per_head) * 4 + step_bytes +
                        size_t(c.n_layers) * (size_t(mu) * sizeof(PagedDecodeUnit) + 4);
  plan.prefill_kv = 2 * bf16s(ctx * Hkv * hd);
  const size_t chunk_act = bf16s(size_t(chunk) * (D + N + 2 * Hq * hd + 3 * F));
  const size_t decode_act = bf16s(size_t(S) * (D * 2 + N + 2 * Hq * hd + 2 * Hkv * hd + 3 * F));
  plan.activations = ctx * 4 + bf16s(ctx * D) + chunk_act + size_t(kLogitRows) * V * 4 + decode_act;
  const int nb64 = (o.max_ctx + 63) / 64;
  // Lists at block 64, and the estimator's scratch at the default stride 16 and block 64 (gpu_model.cpp sizes it for
  // the stride and block run).
  plan.xattn = (size_t(xattn_list_capacity(Hq, nb64)) + 2 * size_t(Hq) * nb64) * 4 +
               xattn_estimate_scratch_bytes(o.xattn_estimate, chunk, o.max_ctx, Hkv, Hq / Hkv, hd, 16, 64);
  plan.workspace = gemm->workspace_bytes() + dec_ws + tables;
  size_t free_b = 0, total_b = 0;
  ELASTIC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = plan.total() - plan.weights - plan.xattn;  // weights are already in; lists only when used
  if (need > free_b)
    throw std::runtime_error("gpu: the plan needs " + gib(need) + " more but " + gib(free_b) +
                             " are free (lower --ctx / -c or --chunk)\n" + plan.describe());

  ids.alloc(ctx * 4);
  hidden.alloc(bf16s(ctx * D));
  kscr.alloc(bf16s(ctx * Hkv * hd));
  vscr.alloc(bf16s(ctx * Hkv * hd));
  xn.alloc(bf16s(size_t(chunk) * D));
  qkv.alloc(bf16s(size_t(chunk) * N));
  q.alloc(bf16s(size_t(chunk) * Hq * hd));
  attn.alloc(bf16s(size_t(chunk) * Hq * hd));
  gu.alloc(bf16s(size_t(chunk) * 2 * F));
  act.alloc(bf16s(size_t(chunk) * F));
  pool.alloc(size_t(Hkv) * hd * 4);
  meta.alloc(sizeof(KVHeadMeta) * c.n_layers * Hkv);
  logits.alloc(size_t(kLogitRows) * V * 4);
  d_x.alloc(bf16s(size_t(S) * D));
  d_xn.alloc(bf16s(size_t(S) * D));
  d_qkv.alloc(bf16s(size_t(S) * N));
  d_q.alloc(bf16s(size_t(S) * Hq * hd));
  d_k.alloc(bf16s(size_t(S) * Hkv * hd));
  d_v.alloc(bf16s(size_t(S) * Hkv * hd));
  d_attn.alloc(bf16s(size_t(S) * Hq * hd));
  d_gu.alloc(bf16s(size_t(S) * 2 * F));
  d_act.alloc(bf16s(size_t(S) * F));
  d_ws.alloc(dec_ws);
  pages = std::make_unique<PagePool>(n_pages, kPageSize);
  k_pool.alloc(size_t(n_pages) * page_bytes());
  v_pool.alloc(size_t(n_pages) * page_bytes());
  page_table.alloc(size_t(n_pages) * 4);
  page_map.alloc(std::max<size_t>(2, size_t(Hkv) * pages_per_head) * 4);  // fork's scratch too: a pair at least
  d_step.alloc(step_bytes);
  h_step.assign(step_bytes, 0);
  d_io = d_step.as<int32_t>();
  dec_heads = reinterpret_cast<PagedDecodeHead*>(d_step.as<uint8_t>() + size_t(16) * S);
  dec_rows = reinterpret_cast<int64_t*>(d_step.as<uint8_t>() + rows_offset);
  dec_units.alloc(size_t(c.n_layers) * mu * sizeof(PagedDecodeUnit));
  dec_n_units.alloc(size_t(c.n_layers) * 4);
  h_next.assign(S, 0);
  graphs.assign(size_t(S) + 1, nullptr);
  eager_steps.assign(size_t(S) + 1, 0);
  slots.resize(S);
  for (Slot& sl : slots) sl.routing = RoutingTable::all_full(c.n_layers, Hkv);

  // RoPE frequencies as the CPU model computes them (llama3 scaling included).
  const std::vector<float> f = compute_rope_inv_freq(c);
  inv_freq.alloc(f.size() * 4);
  ELASTIC_CUDA_CHECK(cudaMemcpy(inv_freq.ptr, f.data(), inv_freq.bytes, cudaMemcpyHostToDevice));
}

GpuModel::GpuModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuModel::~GpuModel() = default;
const ModelConfig& GpuModel::config() const { return impl_->c; }
const GpuPlan& GpuModel::plan() const { return impl_->plan; }
size_t GpuWeights::bytes() const {
  size_t b = embed.bytes + lm_head.bytes + final_norm.bytes;
  for (const GpuLayer& L : layers)
    b += L.attn_norm.bytes + L.w_qkv.bytes + L.b_qkv.bytes + L.q_norm.bytes + L.k_norm.bytes + L.wo.bytes +
         L.mlp_norm.bytes + L.w_gu.bytes + L.w_down.bytes;
  return b;
}

const GpuWeights& GpuModel::weights() const { return *impl_; }
GpuExec GpuModel::exec() const {
  return GpuExec{impl_->stream, impl_->gemm.get(), *impl_->o.attention, impl_->o.xattn_estimate};
}

int GpuModel::slots() const { return static_cast<int>(impl_->slots.size()); }
int GpuModel::length(int slot) const { return impl_->slot_at(slot).length; }
int GpuModel::max_ctx() const { return impl_->o.max_ctx; }
size_t GpuModel::Impl::bytes_held(const Slot& sl) const {
  size_t pages = 0;
  for (const auto& sq : sl.seq) pages += sq ? size_t(sq->pages_held()) : 0;
  return pages * page_bytes() * 2;  // K and V
}
size_t GpuModel::kv_bytes(int slot) const { return impl_->bytes_held(impl_->slot_at(slot)); }
void GpuModel::release(int slot) {
  Impl& m = *impl_;
  Impl::Slot& sl = m.slot_at(slot);
  if (m.run.slot == slot) m.abort_prefill();
  sl.length = 0;
  sl.seq.clear();  // SequencePages return their pages to the pool
  m.tables_dirty = true;
}

size_t GpuModel::kv_bytes_all_full(int slot) const {
  const size_t pages_per_head = (size_t(impl_->slot_at(slot).length) + Impl::kPageSize - 1) / Impl::kPageSize;
  return size_t(impl_->c.n_layers) * impl_->c.n_kv_heads * pages_per_head * impl_->page_bytes() * 2;  // K and V
}
size_t GpuModel::kv_bytes_for(int prompt, int capacity, const RoutingTable& r) const {
  // Prefill stores one layer after another, each a block at a time (store_layer_pages); decode grows a position at
  // a time.
  return size_t(pages_for_layer_major(r, Impl::kPageSize, prompt, r.sparse.block, capacity)) * impl_->page_bytes() * 2;
}
size_t GpuModel::kv_pool_bytes() const { return impl_->plan.kv_pool; }
const RoutingTable& GpuModel::routing(int slot) const { return impl_->slot_at(slot).routing; }

std::unique_ptr<GpuModel> GpuModel::upload(const Model& m, const GpuOptions& o) {
  check_shape(m.config);
  if (device_count() == 0) throw std::runtime_error("gpu: no CUDA device");
  ELASTIC_CUDA_CHECK(cudaSetDevice(o.device));
  auto im = std::make_unique<Impl>();
  im->c = m.config;
  im->o = o;
  const ModelWeights& w = m.weights;
  im->embed = upload_bf16(w.embed);
  if (!w.lm_head.empty()) im->lm_head = upload_bf16(w.lm_head);
  im->final_norm = upload_bf16(w.final_norm);
  for (const LayerWeights& L : w.layers) {
    GpuLayer g;
    g.attn_norm = upload_bf16(L.attn_norm);
    g.w_qkv = upload_bf16(concat({&L.wq, &L.wk, &L.wv}));
    if (!L.bq.empty()) g.b_qkv = upload_bf16(concat({&L.bq, &L.bk, &L.bv}));
    if (!L.q_norm.empty()) g.q_norm = upload_bf16(L.q_norm);
    if (!L.k_norm.empty()) g.k_norm = upload_bf16(L.k_norm);
    g.wo = upload_bf16(L.wo);
    g.mlp_norm = upload_bf16(L.mlp_norm);
    g.w_gu = upload_bf16(concat({&L.w_gate, &L.w_up}));
    g.w_down = upload_bf16(L.w_down);
    im->layers.push_back(std::move(g));
  }
  // A pageable cudaMemcpy may return before its DMA lands, and the model's stream does not wait for the legacy
  // stream (cudaStreamNonBlocking): the first prefill must not read weights still in flight.
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  im->init_common();
  return std::unique_ptr<GpuModel>(new GpuModel(std::move(im)));
}

std::unique_ptr<GpuModel> GpuModel::random(const ModelConfig& c, const GpuOptions& o, uint64_t seed) {
  check_shape(c);
  if (device_count() == 0) throw std::runtime_error("gpu: no CUDA device");
  ELASTIC_CUDA_CHECK(cudaSetDevice(o.device));
  auto im = std::make_unique<Impl>();
  im->c = c;
  im->o = o;
  const int D = c.hidden, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, F = c.intermediate;
  uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  // Uniform weights with the variance of N(0, 1/fan_in) keep the residual stream finite over many layers.
  auto rnd = [&](size_t n, int fan_in) {
    DeviceBuffer b(bf16s(n));
    fill_uniform_bf16(b.as<uint16_t>(), n, s++, std::sqrt(3.f / fan_in), nullptr);
    return b;
  };
  auto ones = [&](size_t n) {
    DeviceBuffer b(bf16s(n));
    fill_const_bf16(b.as<uint16_t>(), n, 1.f, nullptr);
    return b;
  };
  im->embed = rnd(size_t(c.vocab) * D, 1);
  if (!c.tie_embeddings) im->lm_head = rnd(size_t(c.vocab) * D, D);
  im->final_norm = ones(D);
  for (int l = 0; l < c.n_layers; ++l) {
    GpuLayer g;
    g.attn_norm = ones(D);
    g.w_qkv = rnd(size_t(Hq + 2 * Hkv) * hd * D, D);
    if (c.attention_bias) g.b_qkv = rnd(size_t(Hq + 2 * Hkv) * hd, 16);
    if (c.qk_norm) {
      g.q_norm = ones(hd);
      g.k_norm = ones(hd);
    }
    g.wo = rnd(size_t(D) * Hq * hd, Hq * hd);
    g.mlp_norm = ones(D);
    g.w_gu = rnd(size_t(2) * F * D, D);
    g.w_down = rnd(size_t(D) * F, F);
    im->layers.push_back(std::move(g));
  }
  ELASTIC_CUDA_CHECK(cudaDeviceSynchronize());
  im->init_common();
  return std::unique_ptr<GpuModel>(new GpuModel(std::move(im)));
}

}  // namespace elastic::cuda
