// A static token datastore searched through a suffix array, and the chain draft it proposes
// (retrieval drafting: REST, He et al., NAACL 2024). Framework-free host C++17 (STL only;
// no torch, no CUDA): the Python binding is csrc/suffix_binding.cpp, the engine's use
// specdec_ext/engine/datastore.py.
//
// Where the suffix index (suffix_index.h) holds the live text of requests and is updated
// per token, the datastore holds a large fixed corpus (say the target's training text):
// n tokens cost 8 bytes each (the tokens and their suffix array), nothing per depth.
//
// Suffix array: the start positions 0..n-1 ordered by the corpus' first `sort_depth` tokens
// from there (a suffix that runs out is smaller than any extension of it), ties by position.
// So for any pattern of length m <= sort_depth, the suffixes that start with it form one
// contiguous range, and inside that range they are ordered by the token at offset m: each
// continuation token's occurrences form a sub-range, in token order.
//
// propose(context): the longest suffix of the context (at most max_depth tokens, and at
// least one occurrence that is followed by a token) is looked up; from its range the draft
// follows the most frequent continuation (ties: the smaller token) while the running
// probability (the product of count(next) / (count(followed) + prior) along the path) stays
// >= min_prob, at most max_tokens tokens and while the pattern stays within sort_depth.
// When a range holds more than max_scan suffixes, the continuation counts come from
// max_scan evenly spaced entries of it (the range is sorted by continuation, so this is a
// stratified sample); the chosen token's sub-range is then found exactly.
// Score: the sum of the draft's probabilities, as for the suffix index.
//
// Costs: building sorts n positions, O(n log n) comparisons of at most sort_depth tokens.
// A lookup of a pattern of length m is two binary searches, O(m log n); a proposal is
// O(max_depth^2 log n) for the match plus O(max_scan + m log n) per draft token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/suffix_index.h"  // Draft

namespace specdec {
namespace suffix {

struct DatastoreParams {
  int64_t max_tokens = 8;  // draft tokens at most
  int64_t max_depth = 24;  // the longest context suffix matched
  double min_prob = 0.1;   // the draft stops before its running probability drops below
  int64_t max_scan = 4096; // suffixes counted per draft token at most (a stratified sample beyond)
  double prior = 2.0;      // pseudo-count: a continuation's probability is count / (followed + prior)
};

class TokenDatastore {
 public:
  // tokens: the corpus (each >= 0); sort_depth in [1, 2^16]: how deep the suffix array is sorted.
  TokenDatastore(std::vector<int32_t> tokens, int64_t sort_depth) : tokens_(std::move(tokens)), depth_(sort_depth) {
    if (sort_depth < 1 || sort_depth > (1 << 16)) {
      throw std::invalid_argument("sort_depth must be in [1, 65536], got " + std::to_string(sort_depth));
    }
    if (tokens_.size() > static_cast<size_t>(INT32_MAX)) {
      throw std::invalid_argument("tokens must hold at most 2^31 - 1 tokens, got " + std::to_string(tokens_.size()));
    }
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i] < 0) {
        throw std::invalid_argument("tokens[" + std::to_string(i) + "] must be >= 0, got " + std::to_string(tokens_[i]));
      }
    }
    sa_.resize(tokens_.size());
    for (size_t i = 0; i < sa_.size(); ++i) sa_[i] = static_cast<int32_t>(i);
    std::sort(sa_.begin(), sa_.end(), [this](int32_t a, int32_t b) {
      const int c = compare_suffixes(a, b);
      return c != 0 ? c < 0 : a < b;
    });
  }

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t sort_depth() const { return depth_; }
  const std::vector<int32_t>& suffix_array() const { return sa_; }

  // [lo, hi) of the suffix array: the suffixes that start with pattern (m <= sort_depth).
  std::pair<int64_t, int64_t> range(const int32_t* pattern, int64_t m) const {
    if (m < 0 || m > depth_) {
      throw std::invalid_argument("pattern length must be in [0, sort_depth = " + std::to_string(depth_) + "], got " +
                                  std::to_string(m));
    }
    return narrow(0, size(), pattern, m);
  }

  // Occurrences of pattern (m <= sort_depth) in the corpus.
  int64_t count(const int32_t* pattern, int64_t m) const {
    const auto r = range(pattern, m);
    return r.second - r.first;
  }

  // The chain draft after `context` (see the header). No match: an empty draft, match_length 0.
  Draft propose(const int32_t* context, int64_t n, const DatastoreParams& p) const {
    if (p.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0, got " + std::to_string(p.max_tokens));
    if (p.max_depth < 1) throw std::invalid_argument("max_depth must be >= 1, got " + std::to_string(p.max_depth));
    if (!(p.min_prob >= 0.0 && p.min_prob <= 1.0)) throw std::invalid_argument("min_prob must be in [0, 1]");
    if (p.max_scan < 1) throw std::invalid_argument("max_scan must be >= 1, got " + std::to_string(p.max_scan));
    if (!(p.prior >= 0.0) || !std::isfinite(p.prior)) throw std::invalid_argument("prior must be finite and >= 0");
    Draft d;
    if (n <= 0 || p.max_tokens == 0 || tokens_.empty()) return d;
    // the longest matched suffix with a continuation: a longer one's occurrences are a
    // subset of a shorter one's, so the first length that fails ends the search
    const int64_t longest = std::min<int64_t>({n, p.max_depth, depth_ - 1});
    int64_t lo = 0, hi = 0, L = 0;
    for (int64_t m = 1; m <= longest; ++m) {
      const auto r = narrow(0, size(), context + (n - m), m);
      if (followed(r.first, r.second, m) == 0) break;
      lo = r.first, hi = r.second, L = m;
    }
    if (L == 0) return d;
    d.match_length = L;
    std::vector<int32_t> pattern(context + (n - L), context + n);
    double prob = 1.0;
    while (static_cast<int64_t>(d.tokens.size()) < p.max_tokens && static_cast<int64_t>(pattern.size()) < depth_) {
      const int64_t m = static_cast<int64_t>(pattern.size());
      int32_t best = -1;
      int64_t best_count = 0, total = 0;
      most_frequent_next(lo, hi, m, p.max_scan, &best, &best_count, &total);
      if (best < 0) break;
      // the prior keeps a continuation seen once from counting as certain: without it, drafts
      // from rare matches came out at probability 1 and were accepted 6% of the time
      const double scanned = static_cast<double>(total), all = static_cast<double>(followed(lo, hi, m));
      prob *= static_cast<double>(best_count) / (scanned + p.prior * (scanned / all));
      if (prob < p.min_prob) break;
      d.parents.push_back(static_cast<int32_t>(d.tokens.size()) - 1);
      d.tokens.push_back(best);
      d.probs.push_back(prob);
      d.score += prob;
      pattern.push_back(best);
      const auto r = narrow(lo, hi, pattern.data(), m + 1);
      lo = r.first, hi = r.second;
    }
    return d;
  }

 private:
  // <0, 0, >0: suffix a against suffix b over their first depth_ tokens
  int compare_suffixes(int32_t a, int32_t b) const {
    const int64_t n = size();
    for (int64_t j = 0; j < depth_; ++j) {
      const bool ea = a + j >= n, eb = b + j >= n;
      if (ea || eb) return ea == eb ? 0 : (ea ? -1 : 1);
      const int32_t x = tokens_[static_cast<size_t>(a + j)], y = tokens_[static_cast<size_t>(b + j)];
      if (x != y) return x < y ? -1 : 1;
    }
    return 0;
  }

  // <0, 0, >0: the suffix at position s against pattern, over the pattern's m tokens
  int compare_prefix(int32_t s, const int32_t* pattern, int64_t m) const {
    const int64_t n = size();
    for (int64_t j = 0; j < m; ++j) {
      if (s + j >= n) return -1;
      const int32_t x = tokens_[static_cast<size_t>(s + j)];
      if (x != pattern[j]) return x < pattern[j] ? -1 : 1;
    }
    return 0;
  }

  // the sub-range of [lo, hi) whose suffixes start with pattern (lo..hi already agree on
  // any shorter prefix of it, so plain binary searches suffice)
  std::pair<int64_t, int64_t> narrow(int64_t lo, int64_t hi, const int32_t* pattern, int64_t m) const {
    const auto first = sa_.begin() + lo, last = sa_.begin() + hi;
    const auto a = std::lower_bound(first, last, 0, [&](int32_t s, int) { return compare_prefix(s, pattern, m) < 0; });
    const auto b = std::upper_bound(a, last, 0, [&](int, int32_t s) { return compare_prefix(s, pattern, m) > 0; });
    return {a - sa_.begin(), b - sa_.begin()};
  }

  // suffixes in [lo, hi) (all of length >= m) that have a token at offset m: at most one
  // (the corpus' last m tokens) has none, and it sorts first
  int64_t followed(int64_t lo, int64_t hi, int64_t m) const {
    if (lo >= hi) return 0;
    return hi - lo - (sa_[static_cast<size_t>(lo)] + m >= size() ? 1 : 0);
  }

  // the most frequent token at offset m over [lo, hi) (ties: the smaller token), its count
  // and the total counted; over max_scan evenly spaced entries when the range is larger
  void most_frequent_next(int64_t lo, int64_t hi, int64_t m, int64_t max_scan, int32_t* best, int64_t* best_count,
                          int64_t* total) const {
    const int64_t len = hi - lo;
    const int64_t count = std::min(len, max_scan);
    int32_t run_token = -1;
    int64_t run = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = count == len ? lo + i : lo + (i * len) / count;  // runs stay in token order
      const int64_t pos = sa_[static_cast<size_t>(at)] + m;
      if (pos >= size()) continue;
      const int32_t t = tokens_[static_cast<size_t>(pos)];
      ++*total;
      run = t == run_token ? run + 1 : 1;
      run_token = t;
      if (run > *best_count) *best_count = run, *best = t;
    }
  }

  std::vector<int32_t> tokens_;
  std::vector<int32_t> sa_;
  int64_t depth_;
};

}  // namespace suffix
}  // namespace specdec
