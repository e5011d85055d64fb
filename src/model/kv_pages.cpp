// Page pool and per-head page lists (kv_pages.h).
#include "elastic/kv_pages.h"
#include "elastic/sparse_pattern.h"

#include <algorithm>

namespace elastic {
namespace {

void bad(const std::string& what) { throw std::invalid_argument("KV pages: " + what); }

// Pages one head holds after growing from `c0` to `c1` positions, starting from what it kept for the query at c0
// (the SequencePages schedule), without a pool: for pages_for().
int64_t held_pages(HeadMode m, const SparseSettings& s, int P, int c0, int c1) {
  const int B = s.block, qb0 = c0 / B, last = (c1 - 1) / B;
  int64_t pages = 0;
  for (int kb = 0; kb <= last; ++kb) {
    const bool held = kb * int64_t(B) >= c0 || pattern_holds(m, qb0, kb, s);
    if (!held) continue;
    const int positions = static_cast<int>(std::min<int64_t>(B, int64_t(c1) - int64_t(kb) * B));
    pages += (positions + P - 1) / P;
  }
  return pages;
}

// Heads of each mode in `routing` (all layers), or in layer `layer` alone.
std::vector<int64_t> mode_counts(const RoutingTable& routing, int layer = -1) {
  std::vector<int64_t> n(n_sparse_patterns(), 0);
  const size_t H = static_cast<size_t>(routing.n_kv_heads);
  const size_t b = layer < 0 ? 0 : size_t(layer) * H, e = layer < 0 ? routing.mode.size() : b + H;
  for (size_t i = b; i < e; ++i) n.at(static_cast<size_t>(routing.mode[i])) += 1;
  return n;
}

// Pages one head of each mode present in `counts` holds at the end of each prefill step [c0, min(prompt, c0 + step))
// (held_pages; empty for absent modes): the curves both prefill schedules weight by their head counts, computed once
// per mode rather than once per head.
std::vector<std::vector<int64_t>> prefill_curves(const std::vector<int64_t>& counts, const SparseSettings& s, int P,
                                                 int prompt, int step) {
  std::vector<std::vector<int64_t>> curve(counts.size());
  for (size_t m = 0; m < counts.size(); ++m)
    if (counts[m])
      for (int c0 = 0; c0 < prompt; c0 += step)
        curve[m].push_back(held_pages(static_cast<HeadMode>(m), s, P, c0, std::min(prompt, c0 + step)));
  return curve;
}

// Pages the heads counted in `counts` hold after growing from c0 to c1.
int64_t heads_at(const std::vector<int64_t>& counts, const SparseSettings& s, int P, int c0, int c1) {
  int64_t pages = 0;
  for (size_t m = 0; m < counts.size(); ++m)
    if (counts[m]) pages += counts[m] * held_pages(static_cast<HeadMode>(m), s, P, c0, c1);
  return pages;
}

// The most pages decode steps from `prompt` to `n_pos` positions hold (0 without steps): within a block a head's
// pages only grow; a new block can only drop blocks (patterns are monotone, sparse_pattern.h), and a head's count at
// each block's last position never shrinks from block to block. So the most is at the last step or at the last
// position of the block before it.
int64_t decode_peak(const RoutingTable& routing, const std::vector<int64_t>& counts, int P, int prompt, int n_pos) {
  if (n_pos <= prompt) return 0;
  const int last = n_pos - 1, prev = last / routing.sparse.block * routing.sparse.block - 1;
  int64_t most = heads_at(counts, routing.sparse, P, last, last + 1);
  if (prev >= prompt) most = std::max(most, heads_at(counts, routing.sparse, P, prev, prev + 1));
  return most;
}

// The arguments both admission counts take.
void check_pages_for(const char* fn, const RoutingTable& routing, int page_size, int prompt, int n_pos) {
  if (prompt < 1 || n_pos < prompt)
    bad(std::string(fn) + ": prompt " + std::to_string(prompt) + " and n_pos " + std::to_string(n_pos) +
        " (need 1 <= prompt <= n_pos)");
  if (page_size < 16 || routing.sparse.block % page_size)
    bad(std::string(fn) + ": block not a multiple of the page size");
}

}  // namespace

PagePool::PagePool(int64_t n_pages, int page_size) : n_pages_(n_pages), page_size_(page_size) {
  if (page_size < 16 || page_size > 4096 || page_size % 16)
    bad("page size " + std::to_string(page_size) + " must be a multiple of 16 in [16, 4096]");
  if (n_pages < 1 || n_pages > INT32_MAX) bad("pool of " + std::to_string(n_pages) + " pages is not in [1, 2^31)");
  free_.resize(static_cast<size_t>(n_pages));
  for (int64_t i = 0; i < n_pages; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(n_pages - 1 - i);
  in_use_.assign(static_cast<size_t>(n_pages), 0);
}

int32_t PagePool::allocate() {
  if (free_.empty())
    throw OutOfPages("KV page pool: out of pages (all " + std::to_string(n_pages_) + " pages of " +
                     std::to_string(page_size_) + " positions in use)");
  const int32_t p = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(p)] = 1;
  return p;
}

void PagePool::release(int32_t page) {
  if (page < 0 || page >= n_pages_)
    throw std::logic_error("KV page pool: release of page " + std::to_string(page) + ", not in [0, " +
                           std::to_string(n_pages_) + ")");
  if (!in_use_[static_cast<size_t>(page)])
    throw std::logic_error("KV page pool: page " + std::to_string(page) + " released twice");
  in_use_[static_cast<size_t>(page)] = 0;
  free_.push_back(page);
}

SequencePages::SequencePages(PagePool& pool, const RoutingTable& routing) : pool_(pool), routing_(routing) {
  const int B = routing.sparse.block;
  if (routing.n_layers <= 0 || routing.n_kv_heads <= 0 ||
      routing.mode.size() != static_cast<size_t>(routing.n_layers) * routing.n_kv_heads)
    bad("routing has no heads or its mode list does not match its layers x KV heads");
  if (B <= 0 || B % pool.page_size())
    bad("sparse block " + std::to_string(B) + " is not a multiple of the page size " + std::to_string(pool.page_size()));
  n_kv_heads_ = routing.n_kv_heads;
  heads_.resize(routing.mode.size());
  for (size_t i = 0; i < heads_.size(); ++i) heads_[i].mode = routing.mode[i];
}

SequencePages::~SequencePages() { release_all(); }

bool SequencePages::keeps(const HeadPages& h, int qb, int kb) const {
  return pattern_holds(h.mode, qb, kb, routing_.sparse);
}

void SequencePages::grow(int n_pos) {
  if (n_pos < length_) bad("grow to " + std::to_string(n_pos) + " positions below the length " + std::to_string(length_));
  const int P = pool_.page_size(), B = routing_.sparse.block;
  // Pages start at multiples of P: a new page for each of them in [length_, n_pos), and none when length_ sits
  // inside a page (the head's last page has room up to the next multiple).
  const int first = (length_ + P - 1) / P, end = (n_pos + P - 1) / P;  // page indices [first, end) in position order
  if (end <= first) {
    for (HeadPages& h : heads_) h.kept += n_pos - length_;
    length_ = n_pos;
    return;
  }
  std::vector<size_t> before(heads_.size());
  for (size_t i = 0; i < heads_.size(); ++i) before[i] = heads_[i].pages.size();
  try {
    for (HeadPages& h : heads_)
      for (int pg = first; pg < end; ++pg) {
        h.pages.push_back(pool_.allocate());
        h.page_block.push_back(static_cast<int32_t>(int64_t(pg) * P / B));
      }
  } catch (const OutOfPages&) {  // all or nothing: give back what this call took
    for (size_t i = 0; i < heads_.size(); ++i) {
      HeadPages& h = heads_[i];
      while (h.pages.size() > before[i]) {
        pool_.release(h.pages.back());
        h.pages.pop_back();
        h.page_block.pop_back();
      }
    }
    throw;
  }
  for (HeadPages& h : heads_) h.kept += n_pos - length_;
  length_ = n_pos;
}

void SequencePages::release_unused() {
  const int B = routing_.sparse.block, P = pool_.page_size(), qb = length_ / B;
  // Modes that still hold every block (full, XAttention in decode) skip the walk over their pages.
  std::vector<int8_t> holds_all(n_sparse_patterns(), -1);
  for (HeadPages& h : heads_) {
    int8_t& all = holds_all.at(static_cast<size_t>(h.mode));
    if (all < 0) {
      all = 1;
      for (int kb = 0; kb < qb && all; ++kb) all = pattern_holds(h.mode, qb, kb, routing_.sparse);
    }
    if (all) continue;
    size_t w = 0;
    for (size_t i = 0; i < h.pages.size(); ++i) {
      if (keeps(h, qb, h.page_block[i]) || int64_t(h.page_block[i]) * B >= length_) {
        h.pages[w] = h.pages[i];
        h.page_block[w] = h.page_block[i];
        ++w;
      } else {
        pool_.release(h.pages[i]);
        h.kept -= P;  // a dropped block lies before the query's block: its pages are full
      }
    }
    h.pages.resize(w);
    h.page_block.resize(w);
  }
}

void SequencePages::release_all() {
  for (HeadPages& h : heads_) {
    for (const int32_t p : h.pages) pool_.release(p);
    h.pages.clear();
    h.page_block.clear();
    h.kept = 0;
  }
  length_ = 0;
}

void SequencePages::copy_layout_from(const SequencePages& src, std::vector<int32_t>& src_pages,
                                     std::vector<int32_t>& own_pages) {
  if (length_ != 0) bad("copy_layout_from: the sequence is not empty");
  if (src.heads_.size() != heads_.size() || src.routing_.sparse.block != routing_.sparse.block)
    bad("copy_layout_from: the source has another shape or block");
  src_pages.clear();
  own_pages.clear();
  try {
    for (size_t i = 0; i < heads_.size(); ++i) {
      const HeadPages& a = src.heads_[i];
      HeadPages& h = heads_[i];
      for (size_t j = 0; j < a.pages.size(); ++j) {
        h.pages.push_back(pool_.allocate());
        h.page_block.push_back(a.page_block[j]);
        src_pages.push_back(a.pages[j]);
        own_pages.push_back(h.pages.back());
      }
      h.kept = a.kept;
      h.mode = a.mode;
    }
  } catch (const OutOfPages&) {
    release_all();  // all or nothing
    src_pages.clear();
    own_pages.clear();
    throw;
  }
  length_ = src.length_;
}

int64_t SequencePages::row(int layer, int kv_head, int pos) const {
  if (layer < 0 || layer >= routing_.n_layers || kv_head < 0 || kv_head >= n_kv_heads_ || pos < 0 || pos >= length_)
    throw std::out_of_range("KV pages: no layer " + std::to_string(layer) + ", KV head " + std::to_string(kv_head) +
                            ", position " + std::to_string(pos) + " (length " + std::to_string(length_) + ")");
  const HeadPages& h = head(layer, kv_head);
  const int P = pool_.page_size(), B = routing_.sparse.block, kb = pos / B, within = (pos % B) / P;
  // Pages are in block order, a block's pages in position order; new positions sit at the back.
  for (size_t i = h.pages.size(); i-- > 0;)
    if (h.page_block[i] == kb) {
      size_t j = i;
      while (j > 0 && h.page_block[j - 1] == kb) --j;  // j: the block's first page
      if (j + within > i) break;
      return int64_t(h.pages[j + within]) * P + pos % P;
    }
  throw std::out_of_range("KV pages: layer " + std::to_string(layer) + " KV head " + std::to_string(kv_head) +
                          " no longer holds position " + std::to_string(pos) + " (outside its window)");
}

int64_t SequencePages::pages_held() const {
  int64_t n = 0;
  for (const HeadPages& h : heads_) n += static_cast<int64_t>(h.pages.size());
  return n;
}

int64_t pages_for(const RoutingTable& routing, int page_size, int prompt, int chunk, int n_pos) {
  check_pages_for("pages_for", routing, page_size, prompt, n_pos);
  const int step = chunk > 0 ? chunk : prompt;
  const std::vector<int64_t> counts = mode_counts(routing);
  const auto curve = prefill_curves(counts, routing.sparse, page_size, prompt, step);
  int64_t most = 0;
  for (size_t i = 0; size_t(i) * step < size_t(prompt); ++i) {  // every layer at the same step
    int64_t pages = 0;
    for (size_t m = 0; m < counts.size(); ++m)
      if (counts[m]) pages += counts[m] * curve[m][i];
    most = std::max(most, pages);
  }
  return std::max(most, decode_peak(routing, counts, page_size, prompt, n_pos));
}

int64_t pages_for_layer_major(const RoutingTable& routing, int page_size, int prompt, int chunk, int n_pos) {
  check_pages_for("pages_for_layer_major", routing, page_size, prompt, n_pos);
  const int step = chunk > 0 ? chunk : prompt;
  const std::vector<int64_t> counts = mode_counts(routing);
  const auto curve = prefill_curves(counts, routing.sparse, page_size, prompt, step);
  // Prefill: layer l grows through the prompt while layers before it hold what they keep after it (the query at
  // `prompt`) and layers after it hold nothing yet.
  int64_t most = 0, before = 0;
  for (int l = 0; l < routing.n_layers; ++l) {
    const std::vector<int64_t> in_layer = mode_counts(routing, l);
    for (size_t i = 0; size_t(i) * step < size_t(prompt); ++i) {
      int64_t pages = 0;
      for (size_t m = 0; m < in_layer.size(); ++m)
        if (in_layer[m]) pages += in_layer[m] * curve[m][i];
      most = std::max(most, before + pages);
    }
    before += heads_at(in_layer, routing.sparse, page_size, prompt, prompt);
  }
  most = std::max(most, before);
  // Decode steps move every layer together: pages_for's decode terms.
  return std::max(most, decode_peak(routing, counts, page_size, prompt, n_pos));
}

}  // namespace elastic
