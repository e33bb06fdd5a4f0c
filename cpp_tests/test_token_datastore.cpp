// csrc/core/token_datastore.h: the suffix array's order and the pattern counts against brute
// force on random corpora, a worked proposal, and the argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/token_datastore.h"

using specdec::suffix::DatastoreParams;
using specdec::suffix::Draft;
using specdec::suffix::TokenDatastore;

namespace {

// suffixes i and j compared over their first `depth` tokens; ties by position
bool brute_less(const std::vector<int32_t>& c, int64_t depth, int32_t i, int32_t j) {
  const std::vector<int32_t> a(c.begin() + i, c.begin() + std::min<int64_t>(c.size(), i + depth));
  const std::vector<int32_t> b(c.begin() + j, c.begin() + std::min<int64_t>(c.size(), j + depth));
  return a != b ? a < b : i < j;
}

int64_t brute_count(const std::vector<int32_t>& c, const std::vector<int32_t>& p) {
  int64_t n = 0;
  // start positions i < n with text[i : i + m] == p (the empty pattern: every suffix)
  for (size_t i = 0; i < c.size() && i + p.size() <= c.size(); ++i) n += std::equal(p.begin(), p.end(), c.begin() + i);
  return n;
}

}  // namespace

TEST(TokenDatastore, SuffixArrayAndCountsMatchBruteForce) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t depth = 1 + trial % 6, vocab = 2 + trial % 3;
    std::vector<int32_t> corpus(gen() % 80);
    for (auto& t : corpus) t = static_cast<int32_t>(gen() % vocab);
    const TokenDatastore ds(corpus, depth);
    const auto& sa = ds.suffix_array();
    ASSERT_EQ(sa.size(), corpus.size());
    for (size_t i = 1; i < sa.size(); ++i) EXPECT_TRUE(brute_less(corpus, depth, sa[i - 1], sa[i]));
    for (int q = 0; q < 20; ++q) {
      std::vector<int32_t> pattern(gen() % (depth + 1));
      for (auto& t : pattern) t = static_cast<int32_t>(gen() % (vocab + 1));
      EXPECT_EQ(ds.count(pattern.data(), static_cast<int64_t>(pattern.size())), brute_count(corpus, pattern));
    }
  }
}

TEST(TokenDatastore, ProposesTheMostFrequentContinuation) {
  const TokenDatastore ds({5, 1, 2, 3, 5, 1, 2, 4, 5, 1, 2, 3}, 64);
  DatastoreParams p;
  p.max_tokens = 3;
  p.prior = 0.0;
  p.min_prob = 0.0;
  const int32_t context[] = {9, 5, 1};
  const Draft d = ds.propose(context, 3, p);
  EXPECT_EQ(d.match_length, 2);  // "5 1"
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{2, 3, 5}));
  ASSERT_EQ(d.probs.size(), 3u);
  EXPECT_DOUBLE_EQ(d.probs[0], 1.0);        // "5 1" -> 2 three times of three
  EXPECT_DOUBLE_EQ(d.probs[1], 2.0 / 3.0);  // then 3 twice of three
  EXPECT_DOUBLE_EQ(d.probs[2], 2.0 / 3.0);  // the corpus' last "3" has no continuation
  p.prior = 1.0;  // count / (followed + prior): 3/4, then 2/4
  const Draft s = ds.propose(context, 3, p);
  EXPECT_DOUBLE_EQ(s.probs[0], 0.75);
  EXPECT_DOUBLE_EQ(s.probs[1], 0.375);
}

TEST(TokenDatastore, RefusesBadArguments) {
  EXPECT_THROW(TokenDatastore({1, -2}, 8), std::invalid_argument);
  EXPECT_THROW(TokenDatastore({1}, 0), std::invalid_argument);
  const TokenDatastore ds({1, 2}, 8);
  const int32_t c[] = {1};
  DatastoreParams p;
  p.max_scan = 0;
  EXPECT_THROW(ds.propose(c, 1, p), std::invalid_argument);
  p = DatastoreParams{};
  p.prior = -1.0;
  EXPECT_THROW(ds.propose(c, 1, p), std::invalid_argument);
  const int32_t long_pattern[9] = {};
  EXPECT_THROW(ds.count(long_pattern, 9), std::invalid_argument);  // deeper than sort_depth
}
