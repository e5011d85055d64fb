#pragma once
// Paged per-head KV memory: one pool of fixed-size pages (page_size positions of one KV head of one layer), shared
// by every sequence, and per sequence, layer and KV head the list of pages that head keeps. A full head grows page
// by page; a streaming head keeps its sink blocks plus the blocks of its window, and a block that falls out of the
// window goes back to the pool (the pool's free list hands it out again, so the window is a ring of pages), so a
// head's memory is exactly what its routing keeps. Which blocks a head keeps is its pattern's rule (pattern_holds,
// sparse_pattern.h): the same one the CPU reference, the prefill kernels and the hybrid cache follow.
//
// This is bookkeeping only (page ids and counts, no K/V storage): the CPU or GPU backend owns the storage
// [n_pages, page_size, head_dim] and reads it through HeadPages::pages. An engine-level object: the GPU server admits
// requests by what they will hold (pages_for_layer_major, through BatchBackend::kv_bytes_for) against the pool.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "elastic/attention.h"

namespace elastic {

// Thrown when a request for pages exceeds what the pool has free: the message names the pool's size and use.
struct OutOfPages : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class PagePool {
 public:
  // page_size: positions per page, in [16, 4096] and a multiple of 16 (the decode kernel's key tile).
  PagePool(int64_t n_pages, int page_size);
  int page_size() const { return page_size_; }
  int64_t n_pages() const { return n_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return n_pages_ - free_pages(); }
  // Throws OutOfPages when none is free.
  int32_t allocate();
  // Throws std::logic_error for an id out of range or already free (a double free would hand one page to two heads).
  void release(int32_t page);

 private:
  int64_t n_pages_;
  int page_size_;
  std::vector<int32_t> free_;   // LIFO: a page just released (a window's oldest) is the next one handed out
  std::vector<uint8_t> in_use_;  // [n_pages]
};

// One (layer, KV head)'s pages in attention order: the kept key blocks from the lowest, each block's pages in
// position order. Every page is full except the last one, which holds `kept - (pages.size() - 1) * page_size`
// positions: a streaming head's sink blocks all lie before its window, and the window ends at the newest position.
struct HeadPages {
  HeadMode mode = HeadMode::Full;
  std::vector<int32_t> pages;
  std::vector<int32_t> page_block;  // [pages.size()]: the key block each page belongs to
  int kept = 0;                     // positions kept (attended by the next query)
};

// A sequence's pages for every (layer, KV head), under one routing. Returns its pages to the pool when destroyed.
class SequencePages {
 public:
  // routing: the sequence's modes (XAttention heads keep every position in decode, as full heads do) and sparse
  // settings; its block must be a multiple of the pool's page size. Throws std::invalid_argument otherwise.
  SequencePages(PagePool& pool, const RoutingTable& routing);
  ~SequencePages();
  SequencePages(const SequencePages&) = delete;
  SequencePages& operator=(const SequencePages&) = delete;

  // Makes room for positions [length(), n_pos) in every head (their K/V rows are written next), keeping what the
  // queries of those positions attend: call before a prefill chunk or a decode step, then release_unused() after
  // its attention. All or nothing: on OutOfPages the pages this call took go back and length() is unchanged.
  void grow(int n_pos);
  // Returns the blocks that no query from position `length()` on attends (a streaming head's blocks that left its
  // window) to the pool.
  void release_unused();
  // Every page back to the pool (finish, cancel, disconnect); length() becomes 0.
  void release_all();
  // Takes as many pages as `src` holds, head by head, for the same blocks and positions (src's routing must have the
  // same shape; this sequence must be empty): after copying the pages' contents, a fork of src. All or nothing on
  // OutOfPages. Returns the page pairs (src page, this page) in one list each, in the same order.
  void copy_layout_from(const SequencePages& src, std::vector<int32_t>& src_pages, std::vector<int32_t>& own_pages);

  // The pool row (page * page_size + offset) that holds position pos of a head: where a backend writes the
  // position's key and value after grow(). Throws std::out_of_range when the head does not hold pos.
  int64_t row(int layer, int kv_head, int pos) const;
  int length() const { return length_; }
  const HeadPages& head(int layer, int kv_head) const { return heads_[static_cast<size_t>(layer) * n_kv_heads_ + kv_head]; }
  int64_t pages_held() const;
  const RoutingTable& routing() const { return routing_; }

 private:
  bool keeps(const HeadPages& h, int qb, int kb) const;
  PagePool& pool_;
  RoutingTable routing_;
  int n_kv_heads_ = 0, length_ = 0;
  std::vector<HeadPages> heads_;  // [L * Hkv]
};

// Pages a sequence under `routing` holds at most when it prefills `prompt` positions in chunks of `chunk` (0: one
// chunk) and then decodes up to `n_pos` positions in all: what admission reserves. Exact for the schedule
// grow(chunk end or next position) -> attention -> release_unused() that SequencePages is used with.
int64_t pages_for(const RoutingTable& routing, int page_size, int prompt, int chunk, int n_pos);
// The same for a layer-major prefill (the GPU model's: every chunk of layer l, each grow followed by release_unused,
// then layer l + 1, the layers before it holding what they keep for the query at `prompt`), then decode steps that
// move every layer together. Not pages_for's count: earlier layers sit at their final size while a later one is at
// its peak (more), and later layers hold nothing yet (less).
int64_t pages_for_layer_major(const RoutingTable& routing, int page_size, int prompt, int chunk, int n_pos);

}  // namespace elastic
