// Depth-bounded suffix index with continuation counts, and the speculation it proposes
// (SuffixDecoding, Oliaro et al., NeurIPS 2025). Framework-free host C++17 (STL only; no
// torch, no CUDA): the Python binding is csrc/suffix_binding.cpp, the engine's use
// specdec_ext/engine/suffix.py.
//
// The index holds any number of token sequences (ids chosen by the caller) and a trie of
// every substring of length <= max_depth of each of them. Node s (the string on its path)
// keeps
//   count(s) = occurrences of s (start positions i with text[i : i + |s|] == s, over all
//              sequences), and
//   cont(s)  = occurrences of s followed by a token = the sum of its children's counts
//              (0 for a node at max_depth: it is never extended).
// The continuation law after s is child.count / cont(s): occurrences at the very end of a
// sequence (the query's own trailing occurrence, when the index holds the query's text)
// have no continuation and do not dilute it.
//
// Costs: append(seq, t) walks the <= max_depth nodes of that sequence's current suffixes
// (each gets one child on t): O(max_depth) per token, one hash lookup each. A lookup of a
// pattern of length m is m hash lookups. remove(seq) is O(len x max_depth) and prunes the
// nodes whose count reaches 0.
//
// propose(context): for m = 1, 2, .. the last m context tokens are looked up; the first m
// that is absent (or has no continuation) ends the search (a longer pattern cannot do
// better: its occurrences are a subset). Every matched m gets a draft of at most
// min(max_spec_tokens, floor(factor * m + offset)) tokens from its node:
//   path mode: follow the most frequent child (ties: smaller token) while the running
//              probability (the product of child.count / cont along the path) is >= min_prob;
//   tree mode: best-first by that probability (a max-heap; ties: earlier push), children
//              pushed in (count desc, token asc) order, those below min_prob dropped.
// Its score is the sum of its tokens' probabilities (the expected accepted tokens when the
// probabilities are right); the best score wins, ties to the longer match.
#pragma once

#include <cmath>
#include <cstdint>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specdec {
namespace suffix {

struct ProposeParams {
  int64_t max_spec_tokens = 8;  // nodes of a draft at most
  double factor = 1.0;          // size limit floor(factor * match_length + offset)
  double offset = 0.0;
  double min_prob = 0.1;        // candidates whose probability is below are dropped
  bool tree = false;            // best-first tree (else a chain: the most frequent path)
};

// A proposal: node i has token tokens[i], parent parents[i] (-1: a child of the context's
// last token; else < i) and probability probs[i]; score = sum of probs; match_length = the
// pattern length it was built from (0: no proposal).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  std::vector<double> probs;
  double score = 0.0;
  int64_t match_length = 0;
};

class SuffixIndex {
 public:
  explicit SuffixIndex(int64_t max_depth) : max_depth_(max_depth) {
    if (max_depth < 1 || max_depth > (1 << 20)) {
      throw std::invalid_argument("max_depth must be in [1, 2^20], got " + std::to_string(max_depth));
    }
    nodes_.push_back(Node{});  // the root: the empty string
  }

  int64_t max_depth() const { return max_depth_; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()); }
  bool has_sequence(int64_t id) const { return seqs_.count(id) != 0; }

  // Starts an empty sequence `id` (which must not exist yet).
  void add_sequence(int64_t id) {
    if (!seqs_.emplace(id, Seq{}).second) {
      throw std::invalid_argument("sequence " + std::to_string(id) + " already exists");
    }
  }

  // Appends tokens (each >= 0) to sequence `id`.
  void append(int64_t id, const int32_t* tokens, int64_t n) {
    Seq& s = seq(id);
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] < 0) throw std::invalid_argument("tokens must be >= 0, got " + std::to_string(tokens[i]));
    }
    std::vector<int32_t> next;
    next.reserve(static_cast<size_t>(max_depth_));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tokens[i];
      next.clear();
      extend(0, t, next);
      for (int32_t node : s.active) extend(node, t, next);
      s.active.swap(next);
      s.tokens.push_back(t);
    }
  }

  // Removes sequence `id`: every count it contributed is taken back, empty nodes pruned.
  void remove(int64_t id) {
    Seq& s = seq(id);
    std::vector<int32_t> dead;
    const int64_t L = static_cast<int64_t>(s.tokens.size());
    for (int64_t i = 0; i < L; ++i) {
      int32_t node = 0;
      for (int64_t j = i; j < L && j - i < max_depth_; ++j) {
        const int32_t c = child(node, s.tokens[static_cast<size_t>(j)]);
        nodes_[static_cast<size_t>(node)].cont -= 1;
        if (--nodes_[static_cast<size_t>(c)].count == 0) dead.push_back(c);
        node = c;
      }
    }
    for (int32_t c : dead) unlink(c);
    for (int32_t c : dead) free_.push_back(c);
    seqs_.erase(id);
  }

  // count(pattern) and cont(pattern) (see the header); 0 when the pattern is absent or
  // longer than max_depth. The empty pattern is the root: count = cont = tokens indexed.
  std::pair<int64_t, int64_t> counts(const int32_t* pattern, int64_t m) const {
    const int32_t node = find(pattern, m);
    if (node < 0) return {0, 0};
    const Node& x = nodes_[static_cast<size_t>(node)];
    return {node == 0 ? x.cont : x.count, x.cont};
  }

  // The best draft after `context` (its last min(n, max_depth) tokens are matched).
  Draft propose(const int32_t* context, int64_t n, const ProposeParams& p) const {
    if (p.max_spec_tokens < 0) throw std::invalid_argument("max_spec_tokens must be >= 0");
    if (!(p.min_prob >= 0.0 && p.min_prob <= 1.0)) throw std::invalid_argument("min_prob must be in [0, 1]");
    if (!(p.factor >= 0.0) || !std::isfinite(p.factor) || !std::isfinite(p.offset)) {
      throw std::invalid_argument("factor must be finite and >= 0, offset finite");
    }
    Draft best;
    const int64_t longest = n < max_depth_ ? n : max_depth_;
    for (int64_t m = 1; m <= longest; ++m) {
      const int32_t node = find(context + (n - m), m);
      if (node < 0 || nodes_[static_cast<size_t>(node)].cont == 0) break;
      const double cap = std::floor(p.factor * static_cast<double>(m) + p.offset);
      int64_t limit = p.max_spec_tokens;
      if (cap < static_cast<double>(limit)) limit = cap > 0.0 ? static_cast<int64_t>(cap) : 0;
      if (limit == 0) continue;
      Draft d = p.tree ? tree_from(node, limit, p.min_prob) : path_from(node, limit, p.min_prob);
      if (!d.tokens.empty() && d.score >= best.score) {
        d.match_length = m;
        best = std::move(d);
      }
    }
    return best;
  }

 private:
  struct Node {
    int32_t token = -1;
    int32_t parent = -1;
    int32_t depth = 0;
    int64_t count = 0;
    int64_t cont = 0;
    int32_t first_child = -1;  // children: a doubly linked sibling list
    int32_t prev = -1;
    int32_t next = -1;
  };
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> active;  // nodes of the suffixes (length 1 .. max_depth - 1) ending at the end
  };

  static uint64_t key(int32_t parent, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(token);
  }

  Seq& seq(int64_t id) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) throw std::invalid_argument("no sequence " + std::to_string(id));
    return it->second;
  }

  int32_t child(int32_t node, int32_t token) const {
    auto it = edges_.find(key(node, token));
    return it == edges_.end() ? -1 : it->second;
  }

  int32_t find(const int32_t* pattern, int64_t m) const {
    if (m > max_depth_) return -1;
    int32_t node = 0;
    for (int64_t i = 0; i < m && node >= 0; ++i) node = pattern[i] < 0 ? -1 : child(node, pattern[i]);
    return node;
  }

  // One more occurrence of node's string followed by t; the child goes to `active` when it
  // can still be extended.
  void extend(int32_t node, int32_t t, std::vector<int32_t>& active) {
    int32_t c = child(node, t);
    if (c < 0) c = new_child(node, t);
    nodes_[static_cast<size_t>(node)].cont += 1;
    Node& x = nodes_[static_cast<size_t>(c)];
    x.count += 1;
    if (x.depth < max_depth_) active.push_back(c);
  }

  int32_t new_child(int32_t parent, int32_t t) {
    int32_t c;
    if (!free_.empty()) {
      c = free_.back();
      free_.pop_back();
    } else {
      if (nodes_.size() >= static_cast<size_t>(INT32_MAX)) throw std::length_error("suffix index: too many nodes");
      c = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
    }
    Node& p = nodes_[static_cast<size_t>(parent)];
    Node x;
    x.token = t;
    x.parent = parent;
    x.depth = p.depth + 1;
    x.next = p.first_child;
    if (p.first_child >= 0) nodes_[static_cast<size_t>(p.first_child)].prev = c;
    nodes_[static_cast<size_t>(parent)].first_child = c;
    nodes_[static_cast<size_t>(c)] = x;
    edges_.emplace(key(parent, t), c);
    return c;
  }

  void unlink(int32_t c) {
    Node& x = nodes_[static_cast<size_t>(c)];
    if (x.prev >= 0) nodes_[static_cast<size_t>(x.prev)].next = x.next;
    else nodes_[static_cast<size_t>(x.parent)].first_child = x.next;
    if (x.next >= 0) nodes_[static_cast<size_t>(x.next)].prev = x.prev;
    edges_.erase(key(x.parent, x.token));
    x = Node{};
  }

  // node's children with probability >= min_prob, in (count desc, token asc) order.
  std::vector<std::pair<int32_t, double>> likely_children(int32_t node, double prob, double min_prob) const {
    std::vector<std::pair<int32_t, double>> out;
    const Node& x = nodes_[static_cast<size_t>(node)];
    if (x.cont == 0) return out;
    for (int32_t c = x.first_child; c >= 0; c = nodes_[static_cast<size_t>(c)].next) {
      const double q = prob * static_cast<double>(nodes_[static_cast<size_t>(c)].count) / static_cast<double>(x.cont);
      if (q >= min_prob) {
        size_t i = out.size();
        out.emplace_back(c, q);
        while (i > 0 && before(out[i].first, out[i - 1].first)) {
          std::swap(out[i], out[i - 1]);
          --i;
        }
      }
    }
    return out;
  }

  bool before(int32_t a, int32_t b) const {  // a's (count desc, token asc) order precedes b's
    const Node& x = nodes_[static_cast<size_t>(a)];
    const Node& y = nodes_[static_cast<size_t>(b)];
    return x.count != y.count ? x.count > y.count : x.token < y.token;
  }

  static void add(Draft& d, int32_t token, int32_t parent, double prob) {
    d.tokens.push_back(token);
    d.parents.push_back(parent);
    d.probs.push_back(prob);
    d.score += prob;
  }

  Draft path_from(int32_t node, int64_t limit, double min_prob) const {
    Draft d;
    double prob = 1.0;
    for (int64_t i = 0; i < limit; ++i) {
      auto kids = likely_children(node, prob, min_prob);
      if (kids.empty()) break;
      node = kids[0].first;
      prob = kids[0].second;
      add(d, nodes_[static_cast<size_t>(node)].token, static_cast<int32_t>(i) - 1, prob);
    }
    return d;
  }

  Draft tree_from(int32_t node, int64_t limit, double min_prob) const {
    struct Cand {
      double prob;
      int64_t order;  // push order: ties to the earlier push
      int32_t node;
      int32_t parent;
    };
    auto worse = [](const Cand& a, const Cand& b) { return a.prob != b.prob ? a.prob < b.prob : a.order > b.order; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    int64_t pushes = 0;
    for (auto& [c, q] : likely_children(node, 1.0, min_prob)) heap.push(Cand{q, pushes++, c, -1});
    Draft d;
    while (!heap.empty() && static_cast<int64_t>(d.tokens.size()) < limit) {
      const Cand top = heap.top();
      heap.pop();
      const int32_t at = static_cast<int32_t>(d.tokens.size());
      add(d, nodes_[static_cast<size_t>(top.node)].token, top.parent, top.prob);
      for (auto& [c, q] : likely_children(top.node, top.prob, min_prob)) heap.push(Cand{q, pushes++, c, at});
    }
    return d;
  }

  int64_t max_depth_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, int32_t> edges_;
  std::unordered_map<int64_t, Seq> seqs_;
};

}  // namespace suffix
}  // namespace specdec
