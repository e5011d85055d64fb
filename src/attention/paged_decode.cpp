// Paged decode plan and its fp32 reference (paged_decode.h).
#include "elastic/paged_decode.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace elastic {
namespace {
void bad(const std::string& what) { throw std::invalid_argument("paged decode: " + what); }
}  // namespace

PagedDecodePlan plan_paged_decode(const std::vector<const HeadPages*>& heads, int n_kv_heads, int page_size,
                                  int keys_per_unit) {
  if (n_kv_heads <= 0 || heads.empty() || heads.size() % n_kv_heads)
    bad(std::to_string(heads.size()) + " heads is not a positive multiple of " + std::to_string(n_kv_heads) +
        " KV heads");
  if (page_size < kPagedTile || page_size % kPagedTile) bad("page size must be a multiple of 16");
  if (keys_per_unit <= 0 || keys_per_unit % kPagedTile) bad("keys per unit must be a positive multiple of 16");
  PagedDecodePlan p;
  p.n_seqs = static_cast<int>(heads.size() / n_kv_heads);
  p.n_kv_heads = n_kv_heads;
  p.page_size = page_size;
  p.keys_per_unit = keys_per_unit;
  p.heads.resize(heads.size());
  for (size_t i = 0; i < heads.size(); ++i) {
    const HeadPages& h = *heads[i];
    const int64_t n_pages = (int64_t(h.kept) + page_size - 1) / page_size;
    if (h.kept < 1 || n_pages > static_cast<int64_t>(h.pages.size()))
      bad("head " + std::to_string(i) + " keeps " + std::to_string(h.kept) + " positions in " +
          std::to_string(h.pages.size()) + " pages of " + std::to_string(page_size));
    if (p.page_table.size() + n_pages > INT32_MAX || p.units.size() + h.kept / keys_per_unit + 1 > INT32_MAX)
      bad("plan larger than 2^31 entries");
    PagedDecodeHead& d = p.heads[i];
    d.page_offset = static_cast<int32_t>(p.page_table.size());
    d.kept = h.kept;
    p.page_table.insert(p.page_table.end(), h.pages.begin(), h.pages.begin() + n_pages);
    d.unit_begin = static_cast<int32_t>(p.units.size());
    for (int k = 0; k < h.kept; k += keys_per_unit)
      p.units.push_back({static_cast<int32_t>(i), k, std::min(h.kept, k + keys_per_unit)});
    d.unit_end = static_cast<int32_t>(p.units.size());
  }
  return p;
}

void paged_decode_reference(const PagedDecodePlan& plan, const float* q, const float* k_pool, const float* v_pool,
                            int n_heads, int head_dim, float* out) {
  const int Hkv = plan.n_kv_heads, G = n_heads / Hkv, P = plan.page_size, hd = head_dim;
  if (n_heads % Hkv) bad("query heads not a multiple of KV heads");
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  std::vector<double> s, o(hd);
  for (int b = 0; b < plan.n_seqs; ++b)
    for (int kvh = 0; kvh < Hkv; ++kvh) {
      const PagedDecodeHead& h = plan.heads[static_cast<size_t>(b) * Hkv + kvh];
      auto row = [&](const float* pool, int j) {
        return pool + (static_cast<size_t>(plan.page_table[h.page_offset + j / P]) * P + j % P) * hd;
      };
      for (int g = 0; g < G; ++g) {
        const float* qh = q + (static_cast<size_t>(b) * n_heads + kvh * G + g) * hd;
        s.assign(h.kept, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j < h.kept; ++j) {
          const float* k = row(k_pool, j);
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(qh[e]) * k[e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int j = 0; j < h.kept; ++j) {
          const double w = std::exp(s[j] - mx);
          l += w;
          const float* v = row(v_pool, j);
          for (int e = 0; e < hd; ++e) o[e] += w * v[e];
        }
        float* oh = out + (static_cast<size_t>(b) * n_heads + kvh * G + g) * hd;
        for (int e = 0; e < hd; ++e) oh[e] = static_cast<float>(o[e] / l);
      }
    }
}

}  // namespace elastic
