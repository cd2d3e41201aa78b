// Offset-only arena allocator (SuperNeurons §3.2.1): one preallocated region
// of `size` bytes handed out in multiples of `block`.  The heap only does
// bookkeeping on offsets and never touches storage, so the same code plans
// for a real device buffer or for a purely virtual (e.g. 100 GiB) one.
//
// Data structures
//   * free segments live in an address-ordered treap whose nodes also carry
//     the largest segment length in their subtree.  That one augmentation
//     gives first-fit (leftmost subtree that can hold the request) and
//     largest_free (the root's value) in O(log n), and the address order
//     gives the neighbours needed to coalesce on free.
//   * best-fit additionally keeps std::set<(length, offset)>; lower_bound on
//     (request, 0) is exactly "smallest fitting segment, lowest address on
//     ties".  It is only maintained when the strategy is best-fit.
//   * live allocations: hash table offset -> rounded length (the offset is
//     the allocation id).
//
// Every size is 64-bit.  Public entry points validate their arguments and
// report problems with exceptions that pybind11 turns into Python ones
// (invalid_argument -> ValueError, key_error -> KeyError, logic_error ->
// RuntimeError, bad_alloc -> MemoryError); nothing here aborts.
//
// Mutations are ordered so that the only steps that can allocate host
// memory (hash-table insert, a fresh treap slot, a fresh set node) happen
// before any state changes: a std::bad_alloc leaves the heap as it was.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;

// Treap of disjoint free segments keyed by offset.  Nodes live in a vector
// and refer to each other by index so the whole tree is one allocation and
// clear() is cheap; released slots are recycled through a free list.
class FreeTree {
 public:
  static constexpr std::size_t kNil = std::numeric_limits<std::size_t>::max();

  struct Node {
    u64 off;
    u64 len;
    u64 max_len;  // largest `len` in this subtree
    std::uint32_t prio;
    std::size_t left;
    std::size_t right;
  };

  void clear() {
    nodes_.clear();
    spare_.clear();
    root_ = kNil;
    count_ = 0;
  }

  std::size_t count() const { return count_; }
  u64 max_len() const { return root_ == kNil ? 0 : nodes_[root_].max_len; }
  const Node& node(std::size_t i) const { return nodes_[i]; }

  // Makes the next insert() allocation-free (see the note at the top).
  // spare_ never holds more indices than nodes_ has slots, so keeping its
  // capacity >= nodes_'s makes the push in erase() allocation-free too.
  void reserve_one() {
    if (spare_.empty() && nodes_.size() == nodes_.capacity()) {
      const std::size_t cap = nodes_.capacity() * 2 + 16;
      spare_.reserve(cap);
      nodes_.reserve(cap);
    }
  }

  // Precondition: [off, off+len) overlaps no segment in the tree.
  void insert(u64 off, u64 len) {
    std::size_t n = new_node(off, len);
    std::size_t l, r;
    split(root_, off, l, r);
    root_ = merge(merge(l, n), r);
    ++count_;
  }

  // Precondition: a segment starts at `off`.
  void erase(u64 off) {
    std::size_t l, m, r;
    split(root_, off, l, m);
    split(m, off + 1, m, r);
    if (m == kNil || nodes_[m].left != kNil || nodes_[m].right != kNil) {
      // Re-link before reporting so the tree stays usable.
      root_ = merge(merge(l, m), r);
      throw std::logic_error("heap: internal error, free segment at " +
                             std::to_string(off) + " not found");
    }
    spare_.push_back(m);  // cannot reallocate, see reserve_one()
    root_ = merge(l, r);
    --count_;
  }

  // Lowest-address segment with len >= n, or kNil.
  std::size_t first_fit(u64 n) const {
    std::size_t t = root_;
    if (t == kNil || nodes_[t].max_len < n) return kNil;
    for (;;) {
      const Node& x = nodes_[t];
      if (x.left != kNil && nodes_[x.left].max_len >= n) {
        t = x.left;
      } else if (x.len >= n) {
        return t;
      } else {
        t = x.right;  // the subtree max says a fit exists, and not left/here
      }
    }
  }

  // Highest-address segment with len >= n, or kNil.
  std::size_t last_fit(u64 n) const {
    std::size_t t = root_;
    if (t == kNil || nodes_[t].max_len < n) return kNil;
    for (;;) {
      const Node& x = nodes_[t];
      if (x.right != kNil && nodes_[x.right].max_len >= n) {
        t = x.right;
      } else if (x.len >= n) {
        return t;
      } else {
        t = x.left;  // the subtree max says a fit exists, and not right/here
      }
    }
  }

  // Segment with the greatest offset < off, or kNil.
  std::size_t predecessor(u64 off) const {
    std::size_t best = kNil;
    for (std::size_t t = root_; t != kNil;) {
      if (nodes_[t].off < off) {
        best = t;
        t = nodes_[t].right;
      } else {
        t = nodes_[t].left;
      }
    }
    return best;
  }

  // Segment with the smallest offset > off, or kNil.
  std::size_t successor(u64 off) const {
    std::size_t best = kNil;
    for (std::size_t t = root_; t != kNil;) {
      if (nodes_[t].off > off) {
        best = t;
        t = nodes_[t].left;
      } else {
        t = nodes_[t].right;
      }
    }
    return best;
  }

  // In-order (address-ordered) visit; iterative so a corrupted tree being
  // checked cannot blow the C stack.
  template <class F>
  void for_each(F&& f) const {
    std::vector<std::size_t> stack;
    std::size_t t = root_;
    while (t != kNil || !stack.empty()) {
      while (t != kNil) {
        stack.push_back(t);
        t = nodes_[t].left;
      }
      t = stack.back();
      stack.pop_back();
      f(nodes_[t]);
      t = nodes_[t].right;
    }
  }

  // Structural check for tests: heap order of priorities and exact subtree
  // maxima.  Returns an error description, empty when consistent.
  std::string check_structure() const {
    std::string err;
    std::size_t seen = 0;
    std::vector<std::size_t> stack;
    if (root_ != kNil) stack.push_back(root_);
    while (!stack.empty() && err.empty()) {
      std::size_t t = stack.back();
      stack.pop_back();
      if (++seen > nodes_.size()) return "treap: cycle detected";
      const Node& x = nodes_[t];
      u64 m = x.len;
      for (std::size_t c : {x.left, x.right}) {
        if (c == kNil) continue;
        if (nodes_[c].prio > x.prio) err = "treap: heap order violated";
        m = std::max(m, nodes_[c].max_len);
        stack.push_back(c);
      }
      if (m != x.max_len) err = "treap: stale max_len";
    }
    if (err.empty() && seen != count_) err = "treap: node count mismatch";
    return err;
  }

 private:
  std::size_t new_node(u64 off, u64 len) {
    Node n{off, len, len, next_prio(), kNil, kNil};
    if (!spare_.empty()) {
      std::size_t i = spare_.back();
      spare_.pop_back();
      nodes_[i] = n;
      return i;
    }
    reserve_one();
    nodes_.push_back(n);
    return nodes_.size() - 1;
  }

  // xorshift64: deterministic, so runs (and their timings) are reproducible.
  std::uint32_t next_prio() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return static_cast<std::uint32_t>(rng_ >> 32);
  }

  void pull(std::size_t t) {
    Node& x = nodes_[t];
    u64 m = x.len;
    if (x.left != kNil) m = std::max(m, nodes_[x.left].max_len);
    if (x.right != kNil) m = std::max(m, nodes_[x.right].max_len);
    x.max_len = m;
  }

  // l <- nodes with off < key, r <- nodes with off >= key.  Recursion depth
  // is the treap depth, O(log n) expected.
  void split(std::size_t t, u64 key, std::size_t& l, std::size_t& r) {
    if (t == kNil) {
      l = r = kNil;
      return;
    }
    if (nodes_[t].off < key) {
      std::size_t rl;
      split(nodes_[t].right, key, rl, r);
      nodes_[t].right = rl;
      l = t;
    } else {
      std::size_t lr;
      split(nodes_[t].left, key, l, lr);
      nodes_[t].left = lr;
      r = t;
    }
    pull(t);
  }

  // Every offset in a precedes every offset in b.
  std::size_t merge(std::size_t a, std::size_t b) {
    if (a == kNil) return b;
    if (b == kNil) return a;
    if (nodes_[a].prio > nodes_[b].prio) {
      std::size_t m = merge(nodes_[a].right, b);
      nodes_[a].right = m;
      pull(a);
      return a;
    }
    std::size_t m = merge(a, nodes_[b].left);
    nodes_[b].left = m;
    pull(b);
    return b;
  }

  std::vector<Node> nodes_;
  std::vector<std::size_t> spare_;
  std::size_t root_ = kNil;
  std::size_t count_ = 0;
  u64 rng_ = 0x9E3779B97F4A7C15ull;
};

enum class Strategy { kFirstFit, kBestFit };

class Heap {
 public:
  Heap(i64 size, i64 block, i64 alignment, const std::string& strategy) {
    if (alignment < 256 || (alignment & (alignment - 1)) != 0) {
      throw std::invalid_argument("alignment must be a power of two >= 256, got " +
                                  std::to_string(alignment));
    }
    if (block <= 0 || block % alignment != 0) {
      throw std::invalid_argument("block must be a positive multiple of alignment (" +
                                  std::to_string(alignment) + "), got " +
                                  std::to_string(block));
    }
    if (size < block) {
      throw std::invalid_argument("size must be at least one block (" +
                                  std::to_string(block) + " bytes), got " +
                                  std::to_string(size));
    }
    if (strategy == "first_fit") {
      strategy_ = Strategy::kFirstFit;
    } else if (strategy == "best_fit") {
      strategy_ = Strategy::kBestFit;
    } else {
      throw std::invalid_argument("strategy must be 'first_fit' or 'best_fit', got '" +
                                  strategy + "'");
    }
    alignment_ = static_cast<u64>(alignment);
    block_ = static_cast<u64>(block);
    // Rounding down keeps every block whole, so every offset stays aligned.
    size_ = static_cast<u64>(size) / block_ * block_;
    reset_free();
  }

  u64 size() const { return size_; }
  u64 block() const { return block_; }
  u64 alignment() const { return alignment_; }
  std::string strategy() const {
    return strategy_ == Strategy::kFirstFit ? "first_fit" : "best_fit";
  }

  u64 round(i64 nbytes) const {
    check_request(nbytes);
    u64 n = static_cast<u64>(nbytes);
    // n <= INT64_MAX and block <= INT64_MAX, so the sum fits in u64.
    return (n + block_ - 1) / block_ * block_;
  }

  i64 try_alloc(i64 nbytes) {
    check_request(nbytes);
    if (static_cast<u64>(nbytes) > size_) return -1;
    const u64 need = round(nbytes);
    if (need > free_tree_.max_len()) return -1;

    u64 off, len;
    std::set<std::pair<u64, u64>>::iterator fit;
    if (strategy_ == Strategy::kBestFit) {
      fit = by_size_.lower_bound({need, 0});
      len = fit->first;
      off = fit->second;
    } else {
      const auto& n = free_tree_.node(free_tree_.first_fit(need));
      off = n.off;
      len = n.len;
    }

    allocated_.emplace(off, need);  // the only step that may allocate
    // Carve from the low end so the remainder keeps the segment's place in
    // address order; re-using erased slots/nodes keeps this allocation-free.
    free_tree_.erase(off);
    if (len > need) free_tree_.insert(off + need, len - need);
    if (strategy_ == Strategy::kBestFit) {
      auto node = by_size_.extract(fit);
      if (len > need) {
        node.value() = {len - need, off + need};
        by_size_.insert(std::move(node));
      }
    }
    used_ += need;
    high_water_ = std::max(high_water_, used_);
    return static_cast<i64>(off);
  }

  // The top end of the highest-address segment that holds the request: for
  // blocks that wait for a later reader (prefetches), kept out of the low
  // addresses where first-fit places everything else.
  i64 try_alloc_top(i64 nbytes) {
    check_request(nbytes);
    if (static_cast<u64>(nbytes) > size_) return -1;
    const u64 need = round(nbytes);
    if (need > free_tree_.max_len()) return -1;

    const auto& n = free_tree_.node(free_tree_.last_fit(need));
    const u64 seg = n.off;
    const u64 len = n.len;
    const u64 off = seg + len - need;

    allocated_.emplace(off, need);  // the only step that may allocate
    // The remainder keeps the segment's start: erase and re-insert it shorter.
    free_tree_.erase(seg);
    if (len > need) free_tree_.insert(seg, len - need);
    if (strategy_ == Strategy::kBestFit) {
      auto node = by_size_.extract({len, seg});
      if (len > need) {
        node.value() = {len - need, seg};
        by_size_.insert(std::move(node));
      }
    }
    used_ += need;
    high_water_ = std::max(high_water_, used_);
    return static_cast<i64>(off);
  }

  void free(i64 offset) {
    auto it = find_live(offset);
    const u64 off = it->first;
    const u64 len = it->second;

    const std::size_t p = free_tree_.predecessor(off);
    const std::size_t s = free_tree_.successor(off);
    const bool join_prev =
        p != FreeTree::kNil && free_tree_.node(p).off + free_tree_.node(p).len == off;
    const bool join_next = s != FreeTree::kNil && off + len == free_tree_.node(s).off;
    const u64 prev_off = join_prev ? free_tree_.node(p).off : 0;
    const u64 prev_len = join_prev ? free_tree_.node(p).len : 0;
    const u64 next_off = join_next ? free_tree_.node(s).off : 0;
    const u64 next_len = join_next ? free_tree_.node(s).len : 0;
    const u64 seg_off = join_prev ? prev_off : off;
    const u64 seg_len = prev_len + len + next_len;

    // Possibly-allocating steps first (see the note at the top).
    free_tree_.reserve_one();
    if (strategy_ == Strategy::kBestFit) {
      if (!join_prev && !join_next) {
        by_size_.emplace(seg_len, seg_off);
      } else {
        // Recycle a neighbour's set node for the merged segment.
        auto node = join_prev ? by_size_.extract({prev_len, prev_off})
                              : by_size_.extract({next_len, next_off});
        if (join_prev && join_next) by_size_.erase({next_len, next_off});
        node.value() = {seg_len, seg_off};
        by_size_.insert(std::move(node));
      }
    }
    if (join_prev) free_tree_.erase(prev_off);
    if (join_next) free_tree_.erase(next_off);
    free_tree_.insert(seg_off, seg_len);

    allocated_.erase(it);
    used_ -= len;
  }

  u64 size_of(i64 offset) const { return find_live(offset)->second; }

  bool can_alloc(i64 nbytes) const {
    check_request(nbytes);
    // Both strategies succeed exactly when some segment is large enough.
    return static_cast<u64>(nbytes) <= size_ && round(nbytes) <= free_tree_.max_len();
  }

  u64 used_bytes() const { return used_; }
  u64 free_bytes() const { return size_ - used_; }
  u64 largest_free() const { return free_tree_.max_len(); }
  u64 high_water() const { return high_water_; }
  std::size_t num_allocated() const { return allocated_.size(); }
  std::size_t num_free_segments() const { return free_tree_.count(); }
  double fragmentation() const {
    const u64 f = free_bytes();
    if (f == 0) return 0.0;
    return 1.0 - static_cast<double>(largest_free()) / static_cast<double>(f);
  }

  void reset_high_water() { high_water_ = used_; }

  std::vector<std::pair<u64, u64>> allocations() const {
    std::vector<std::pair<u64, u64>> out(allocated_.begin(), allocated_.end());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<std::pair<u64, u64>> free_segments() const {
    std::vector<std::pair<u64, u64>> out;
    out.reserve(free_tree_.count());
    free_tree_.for_each([&](const FreeTree::Node& n) { out.emplace_back(n.off, n.len); });
    return out;
  }

  void clear() {
    allocated_.clear();
    used_ = 0;
    reset_free();
  }

  // Full O(n log n) consistency check for tests; throws RuntimeError with a
  // description of the first violation found.
  void check_invariants() const {
    auto fail = [](const std::string& what) { throw std::logic_error("heap invariant: " + what); };
    std::string err = free_tree_.check_structure();
    if (!err.empty()) fail(err);

    auto segs = free_segments();
    auto live = allocations();
    u64 free_sum = 0, used_sum = 0, largest = 0;
    for (std::size_t i = 0; i < segs.size(); ++i) {
      const auto& [o, l] = segs[i];
      if (l == 0 || o % block_ || l % block_) fail("misaligned or empty free segment");
      if (i > 0 && segs[i - 1].first + segs[i - 1].second >= o)
        fail("free segments overlap or are not coalesced");
      free_sum += l;
      largest = std::max(largest, l);
    }
    for (const auto& [o, l] : live) {
      if (l == 0 || o % block_ || l % block_) fail("misaligned or empty allocation");
      used_sum += l;
    }
    // Free and live pieces, merged by address, must tile [0, size) exactly.
    std::vector<std::pair<u64, u64>> all(segs);
    all.insert(all.end(), live.begin(), live.end());
    std::sort(all.begin(), all.end());
    u64 cursor = 0;
    for (const auto& [o, l] : all) {
      if (o != cursor) fail("pieces do not tile the arena");
      cursor = o + l;
    }
    if (cursor != size_) fail("pieces do not tile the arena");
    if (used_sum != used_) fail("used_bytes out of sync");
    if (free_sum != free_bytes()) fail("free_bytes out of sync");
    if (largest != free_tree_.max_len()) fail("largest_free out of sync");
    if (high_water_ < used_) fail("high_water below used_bytes");
    if (strategy_ == Strategy::kBestFit) {
      if (by_size_.size() != segs.size()) fail("best-fit index size mismatch");
      for (const auto& [o, l] : segs)
        if (!by_size_.count({l, o})) fail("best-fit index missing a segment");
    } else if (!by_size_.empty()) {
      fail("best-fit index used under first-fit");
    }
  }

 private:
  void check_request(i64 nbytes) const {
    if (nbytes <= 0) {
      throw std::invalid_argument("nbytes must be >= 1, got " + std::to_string(nbytes));
    }
  }

  std::unordered_map<u64, u64>::const_iterator find_live(i64 offset) const {
    auto it = offset < 0 ? allocated_.end() : allocated_.find(static_cast<u64>(offset));
    if (it == allocated_.end()) {
      throw py::key_error("offset " + std::to_string(offset) +
                          " is not a live allocation (double free or never allocated)");
    }
    return it;
  }

  void reset_free() {
    free_tree_.clear();
    by_size_.clear();
    free_tree_.insert(0, size_);
    if (strategy_ == Strategy::kBestFit) by_size_.emplace(size_, 0);
  }

  u64 size_ = 0, block_ = 0, alignment_ = 0;
  Strategy strategy_ = Strategy::kFirstFit;
  u64 used_ = 0, high_water_ = 0;
  FreeTree free_tree_;
  std::set<std::pair<u64, u64>> by_size_;  // (len, off); best-fit only
  std::unordered_map<u64, u64> allocated_;  // offset -> rounded length
};

}  // namespace

PYBIND11_MODULE(_heap, m) {
  m.doc() = "Offset-only first-fit/best-fit arena allocator (see neuron.memory.heap).";

  py::class_<Heap>(m, "Heap")
      .def(py::init<i64, i64, i64, const std::string&>(), py::arg("size"),
           py::arg("block") = 1024, py::arg("alignment") = 256,
           py::arg("strategy") = "first_fit")
      .def_property_readonly("size", &Heap::size)
      .def_property_readonly("block", &Heap::block)
      .def_property_readonly("alignment", &Heap::alignment)
      .def_property_readonly("strategy", &Heap::strategy)
      .def("round", &Heap::round, py::arg("nbytes"))
      .def("try_alloc", &Heap::try_alloc, py::arg("nbytes"))
      .def("try_alloc_top", &Heap::try_alloc_top, py::arg("nbytes"))
      .def("free", &Heap::free, py::arg("offset"))
      .def("size_of", &Heap::size_of, py::arg("offset"))
      .def("can_alloc", &Heap::can_alloc, py::arg("nbytes"))
      .def_property_readonly("used_bytes", &Heap::used_bytes)
      .def_property_readonly("free_bytes", &Heap::free_bytes)
      .def_property_readonly("largest_free", &Heap::largest_free)
      .def_property_readonly("high_water", &Heap::high_water)
      .def_property_readonly("num_allocated", &Heap::num_allocated)
      .def_property_readonly("num_free_segments", &Heap::num_free_segments)
      .def_property_readonly("fragmentation", &Heap::fragmentation)
      .def("reset_high_water", &Heap::reset_high_water)
      .def("allocations", &Heap::allocations)
      .def("free_segments", &Heap::free_segments)
      .def("clear", &Heap::clear)
      .def("check_invariants", &Heap::check_invariants);
}
