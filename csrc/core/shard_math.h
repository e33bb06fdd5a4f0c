// Vocabulary-parallel verify / sample: the math of a row whose logits are split over P ranks
// into contiguous vocabulary shards [bounds[r], bounds[r+1]). Framework-free; the local passes
// are the CPU kernels' own helpers (cpu/shard_kernels.h), the collectives live in Python
// (specdec_ext/distributed).
//
// A call runs a fixed sequence of steps (ShardPlan); after each, every rank all-gathers its
// output (O(B * (K+1)) values, never O(V)) and hands the P outputs to the later steps:
//   kMax:   local max and first argmax of every used position (positions 0..n_b);
//   filter passes (only with top_k / top_p / min_p): the radix passes of core/filter_math.h's
//          reference, each a histogram of the shard that the next step sums over the shards
//          (integer sums: the cutoff of the whole row, whatever the split);
//   kSums:  with the global max m_i (and cutoff): the shard's tile-sum COVER of
//          sum_v exp((l_v - m_i) / T) (core/tile_sum.h: the aligned tree blocks inside the
//          shard), and for the draft token it owns, its e = exp((l_x - m_i) / T) and q(x);
//   kRaces: with the global sums s_i (the covers folded in rank order: the canonical tree),
//          every rank decides the same way which position needs a race (exact mode: the first
//          rejection j, by the same ratio test on the same numbers; coupled mode: every used
//          position) and runs that race on its shard: its best coarse entry (key, index) and
//          that entry's fine winner, for the residual weights and for p (the fallback);
//   finish: the global winner: (key, index) by max with ties to the lower index, its fine winner.
//
// Parts. The coarse race runs over PARTS: a race tile (kRaceTile tokens) cut at the shard
// bounds. When every bound is a multiple of kRaceTile, parts are tiles, each shard's values
// and keys are the single-device kernel's own, and the combined sums (same tree), ratio tests
// and race winners are BIT-IDENTICAL to verify / sample on the gathered logits. Otherwise a
// tile split between two ranks becomes two parts: a part that starts on a tile boundary keeps
// the tile's exponential, one that starts inside a tile draws its own (stream *Part, keyed by
// its first token), so every coarse entry has an independent Exp(1) and the race is still
// exact in law; only float rounding of the sums differs from one device.
#pragma once

#include <stdint.h>

#include <limits>

#include "filter_math.h"
#include "macros.h"
#include "rng.h"
#include "sampling_params.h"
#include "tile_sum.h"
#include "verify_math.h"

namespace specdec {

// The parts of the shard [s, e): the tiles it touches (0 when e <= s).
SPECDEC_HD int64_t shard_part_count(int64_t s, int64_t e) {
  return e <= s ? 0 : (e - 1) / kRaceTile - s / kRaceTile + 1;
}

// The end of the part that starts at token v of a shard ending at e.
SPECDEC_HD int64_t part_end(int64_t v, int64_t e) {
  const int64_t tile_end = (v / kRaceTile + 1) * kRaceTile;
  return tile_end < e ? tile_end : e;
}

// A vocabulary split into P contiguous shards, bounds[0] = 0 < bounds[1] < ... < bounds[P] = V.
struct ShardLayout {
  const int64_t* bounds = nullptr;  // [P + 1]
  int64_t P = 0;

  SPECDEC_HD int64_t start(int64_t r) const { return bounds[r]; }
  SPECDEC_HD int64_t end(int64_t r) const { return bounds[r + 1]; }
  SPECDEC_HD int64_t vocab() const { return bounds[P]; }
  // the index of shard r's first part among all parts of the row
  SPECDEC_HD int64_t first_part(int64_t r) const {
    int64_t p = 0;
    for (int64_t q = 0; q < r; ++q) p += shard_part_count(start(q), end(q));
    return p;
  }
  SPECDEC_HD int64_t part_count(int64_t r) const { return shard_part_count(start(r), end(r)); }
  // the cover size of shard r, and the most over all shards (kSums's width)
  SPECDEC_HD int64_t cover_size(int64_t r) const {
    const int64_t a = first_part(r);
    return tile_cover_size(a, a + part_count(r));
  }
  SPECDEC_HD int64_t max_cover_size() const {
    int64_t c = 0;
    for (int64_t r = 0; r < P; ++r) c = cover_size(r) > c ? cover_size(r) : c;
    return c;
  }
  // the shard holding token v in [0, V)
  SPECDEC_HD int64_t owner(int64_t v) const {
    int64_t r = 0;
    while (r + 1 < P && v >= end(r)) ++r;
    return r;
  }
};

// The steps of one call, in order; after each, every rank all-gathers its output:
//   kMax (1 step), then the filter passes of core/filter_math.h's reference (their histograms
//   summed over the shards: integer sums, exact in any order): top-k (4 radix passes, when a
//   top_k is given), top-p (4, when a top_p is given), min-p (1, when a min_p is given), then
//   kSums and kRaces.
enum class ShardStep : int8_t { kMax, kTopK, kTopP, kMinP, kSums, kRaces };

struct ShardPlan {
  static constexpr int kMaxSteps = 1 + 4 + 4 + 1 + 2;
  int n = 0;
  // The CUDA kernels' protocol (cuda/shard_kernels.cuh): kMax also sends the row's huge flag,
  // kSums sends covers of (max, sum) PAIRS, the canonical per-tile stats of the CUDA kernels
  // (a pair tree, not a sum against the row max; see combine_sum). The CPU kernels: false.
  bool pairs = false;
  ShardStep kind[kMaxSteps] = {};
  int8_t pass[kMaxSteps] = {};  // the radix pass (0..3) of a top-k / top-p step

  SPECDEC_HD static ShardPlan of(bool top_k, bool top_p, bool min_p, bool pairs = false) {
    ShardPlan p;
    p.pairs = pairs;
    p.push(ShardStep::kMax, 0);
    for (int8_t r = 0; top_k && r < kRadixPasses; ++r) p.push(ShardStep::kTopK, r);
    for (int8_t r = 0; top_p && r < kRadixPasses; ++r) p.push(ShardStep::kTopP, r);
    if (min_p) p.push(ShardStep::kMinP, 0);
    p.push(ShardStep::kSums, 0);
    p.push(ShardStep::kRaces, 0);
    return p;
  }
  SPECDEC_HD void push(ShardStep k, int8_t r) {
    kind[n] = k;
    pass[n++] = r;
  }
  SPECDEC_HD int sums() const { return n - 2; }
  SPECDEC_HD int races() const { return n - 1; }
};

// Float64 outputs (a float or an index < 2^53): kMax, kSums, kRaces; int64 ones: the filter
// passes (counts; masses as uint64 bits; min-p: the order_key of the shard's bound).
SPECDEC_HD bool shard_step_is_int(ShardStep k) {
  return k == ShardStep::kTopK || k == ShardStep::kTopP || k == ShardStep::kMinP;
}

// A step's output width per (row, position):
//   kMax   2: max, first argmax (global id); pairs: 3, then 1 if a finite logit has |l| >= 2^127
//          (the CUDA kernels then take the sum against the row max: cuda kHugeLogit)
//   kTopK  256 counts of the pass's digit;  kTopP 256 counts, then 256 fixed-point masses
//   kMinP  1: order_key of the smallest logit with e >= min_p (start: the max)
//   kSums  the shard's cover values (padded to the largest cover), then e_x, q_x of the draft
//          the shard owns (0 elsewhere); pairs: 2 values per cover node, (max, sum)
//   kRaces 7: ShardRace
SPECDEC_HD int64_t shard_step_width(ShardStep k, const ShardLayout& L, bool pairs = false) {
  switch (k) {
    case ShardStep::kMax: return pairs ? 3 : 2;
    case ShardStep::kTopK: return kRadixBins;
    case ShardStep::kTopP: return 2 * kRadixBins;
    case ShardStep::kMinP: return 1;
    case ShardStep::kSums: return (pairs ? 2 : 1) * L.max_cover_size() + 2;
    default: return 7;
  }
}

SPECDEC_HD void store_max(double* out, float m, int64_t arg) {
  out[0] = m;
  out[1] = static_cast<double>(arg);
}

// kRaces of one (row, position): a shard's best coarse entries and their fine winners.
struct ShardRace {
  float key_w;     // best coarse key of the residual weights (-1: no race here)
  int64_t part_w;  // its part (the part's first token: ties go to the lower one)
  int64_t token_w; // its fine winner
  float key_p;     // the same for p (the fallback when every residual weight is 0)
  int64_t part_p;
  int64_t token_p;
  bool bad_q;      // a bad dense q entry in the shard's part of the q row
};

SPECDEC_HD void store_race(double* out, const ShardRace& r) {
  out[0] = r.key_w; out[1] = static_cast<double>(r.part_w); out[2] = static_cast<double>(r.token_w);
  out[3] = r.key_p; out[4] = static_cast<double>(r.part_p); out[5] = static_cast<double>(r.token_p);
  out[6] = r.bad_q ? 1.0 : 0.0;
}

SPECDEC_HD ShardRace load_race(const double* in) {
  return ShardRace{static_cast<float>(in[0]), static_cast<int64_t>(in[1]), static_cast<int64_t>(in[2]),
                   static_cast<float>(in[3]), static_cast<int64_t>(in[4]), static_cast<int64_t>(in[5]),
                   in[6] != 0.0};
}

// No race at this (row, position) on this shard: a key every real entry beats (keys are >= 0).
SPECDEC_HD ShardRace shard_race_empty() { return ShardRace{-1.0f, -1, -1, -1.0f, -1, -1, false}; }

// The P outputs of every step done so far, each [B, K+1, width] contiguous.
struct ShardGathered {
  ShardPlan plan;
  const void* const* step[ShardPlan::kMaxSteps] = {};  // [P] pointers per step done
  int64_t width[ShardPlan::kMaxSteps] = {};
  int64_t K = 0;

  SPECDEC_HD const double* at(int s, int64_t r, int64_t b, int64_t i) const {
    return static_cast<const double*>(step[s][r]) + (b * (K + 1) + i) * width[s];
  }
  SPECDEC_HD const int64_t* at_int(int s, int64_t r, int64_t b, int64_t i) const {
    return static_cast<const int64_t*>(step[s][r]) + (b * (K + 1) + i) * width[s];
  }
};

// The cutoff search of one (row, position) after some filter steps: core/filter_math.h's
// reference passes, each on the histogram summed over the shards.
struct ShardCutSearch {
  RadixState topk;
  int64_t k_left = 0;
  float topk_cut = -std::numeric_limits<float>::infinity();  // once the 4 top-k passes are done
  RadixState topp;
  uint64_t above = 0;
  double limit = 0.0;
  float cut = -std::numeric_limits<float>::infinity();  // the cutoff of the passes done
};

// The histograms of filter step s at (row b, position i) summed over the shards, held by one
// thread (CPU kernels, the finish step). The CUDA kernels sum them block-wide into shared memory
// instead (cuda/shard_kernels.cuh BlockHistograms: 3 KB per thread would be local memory).
struct LocalHistograms {
  uint32_t count[kRadixBins];
  uint64_t mass[kRadixBins];
  SPECDEC_HD void sum(const ShardGathered& g, const ShardLayout& L, int s, int64_t b, int64_t i, bool masses) {
    for (int d = 0; d < kRadixBins; ++d) {
      count[d] = 0;
      mass[d] = 0;
    }
    for (int64_t r = 0; r < L.P; ++r) {
      const int64_t* h = g.at_int(s, r, b, i);
      for (int d = 0; d < kRadixBins; ++d) {
        count[d] += static_cast<uint32_t>(h[d]);
        if (masses) mass[d] += static_cast<uint64_t>(h[kRadixBins + d]);
      }
    }
  }
};

// Replays the filter steps before step `upto` for (row b, position i) with filters f over a
// V-token vocabulary (steps of a filter the row does not use are skipped). At upto = the
// kSums step: the position's cutoff, the one filter_cutoff_reference finds on the whole row.
// Hist: LocalHistograms or the CUDA block's (sum(g, L, s, b, i, masses), then count / mass).
template <typename Hist>
SPECDEC_HD ShardCutSearch replay_cut_with(Hist& h, const ShardGathered& g, const ShardLayout& L, int64_t b,
                                          int64_t i, const FilterSpec& f, int upto) {
  ShardCutSearch c;
  c.k_left = f.top_k;
  const int64_t V = L.vocab();
  for (int s = 1; s < upto; ++s) {
    const ShardStep kind = g.plan.kind[s];
    if (kind == ShardStep::kTopK && f.top_k > 0 && f.top_k < V) {
      h.sum(g, L, s, b, i, false);
      c.topk.descend(topk_digit(h.count, c.k_left));
      if (c.topk.done()) c.cut = c.topk_cut = key_to_float(c.topk.prefix);
    } else if (kind == ShardStep::kTopP && f.top_p < 1.0f) {
      h.sum(g, L, s, b, i, true);
      if (g.plan.pass[s] == 0) {
        uint64_t total = 0;
        for (int d = 0; d < kRadixBins; ++d) total += h.mass[d];
        c.limit = topp_limit(f.top_p, total);
      }
      c.topp.descend(topp_digit(h.mass, h.count, c.above, c.limit));
      if (c.topp.done()) c.cut = max_cutoff(c.cut, key_to_float(c.topp.prefix));
    } else if (kind == ShardStep::kMinP && f.min_p > 0.0f) {
      uint32_t lo = 0xffffffffu;
      for (int64_t r = 0; r < L.P; ++r) {
        const uint32_t k = static_cast<uint32_t>(g.at_int(s, r, b, i)[0]);
        lo = k < lo ? k : lo;
      }
      c.cut = max_cutoff(c.cut, key_to_float(lo));
    }
  }
  return c;
}

SPECDEC_HD ShardCutSearch replay_cut(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i,
                                     const FilterSpec& f, int upto) {
  LocalHistograms h;
  return replay_cut_with(h, g, L, b, i, f, upto);
}

// The global max (NaN if any shard saw a NaN) and first argmax of (row b, position i).
SPECDEC_HD void combine_max(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, float& m,
                            int64_t& arg) {
  m = -std::numeric_limits<float>::infinity();
  arg = 0;
  for (int64_t r = 0; r < L.P; ++r) {
    const double* s = g.at(0, r, b, i);  // step 0: kMax
    const float mr = static_cast<float>(s[0]);
    if (mr != mr) {
      m = mr;
      arg = 0;
      return;
    }
    if (mr > m || r == 0) {  // strict: the lower shard keeps a tie (the first argmax)
      m = mr;
      arg = static_cast<int64_t>(s[1]);
    }
  }
}

// Whether a shard saw a finite logit with |l| >= 2^127 at (row b, position i) (pairs only).
SPECDEC_HD bool combine_huge(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i) {
  bool huge = false;
  for (int64_t r = 0; r < L.P; ++r) huge = huge || g.at(0, r, b, i)[2] != 0.0;
  return huge;
}

// The (max, sum) pairs of the CUDA kernels' tile tree: stats_merge at the row's 1 / T, whose
// identity (-inf, 0) merges exactly (verify_math.h).
struct PairMerge {
  float inv_t;
  SPECDEC_HD SoftmaxStats operator()(SoftmaxStats a, SoftmaxStats b) const { return stats_merge(a, b, inv_t); }
  SPECDEC_HD static SoftmaxStats empty() { return stats_empty(); }
};

// The global sum of (row b, position i): every shard's cover, in rank order, folded into
// core/tile_sum.h's canonical tree: of the sums against the row max (CPU kernels, and the CUDA
// ones on a huge row), or of the (max, sum) pairs (CUDA kernels). PairStack / SumStack: a
// TileTreeStack (one thread), or the CUDA kernels' warp-held stack (cuda/tile_stats.cuh
// WarpTileStack) with the same add_block / total.
template <typename PairStack, typename SumStack>
SPECDEC_HD float combine_sum_with(PairStack& pair, SumStack& sum, const ShardGathered& g, const ShardLayout& L,
                                  int64_t b, int64_t i) {
  const bool pairs = g.plan.pairs && !combine_huge(g, L, b, i);
  for (int64_t r = 0; r < L.P; ++r) {
    const double* s = g.at(g.plan.sums(), r, b, i);
    const int64_t a = L.first_part(r), end = a + L.part_count(r);
    int64_t c = 0;
    for (int64_t p = a; p < end; ++c) {
      const int lv = tile_cover_level(p, end);
      if (pairs) pair.add_block(SoftmaxStats{static_cast<float>(s[2 * c]), static_cast<float>(s[2 * c + 1])}, lv);
      else sum.add_block(static_cast<float>(s[g.plan.pairs ? 2 * c + 1 : c]), lv);
      p += int64_t(1) << lv;
    }
  }
  return pairs ? pair.total().sum : sum.total();
}

SPECDEC_HD float combine_sum(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, float inv_t = 1.0f) {
  TileTreeStack<SoftmaxStats, PairMerge> pair(0, PairMerge{inv_t});
  TileSumStack sum;
  return combine_sum_with(pair, sum, g, L, b, i);
}

// e_x and q(x) of the draft x at (row b, position i), from the shard that owns x.
SPECDEC_HD void combine_draft(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, int64_t x,
                              float& e_x, float& q_x) {
  const double* s = g.at(g.plan.sums(), L.owner(x), b, i);
  const int64_t w = g.width[g.plan.sums()];
  e_x = static_cast<float>(s[w - 2]);
  q_x = static_cast<float>(s[w - 1]);
}

// The winner of the race at (row b, position i): the best coarse entry over every shard
// (residual weights; p when all of them weigh 0) and its fine winner. bad_q: a shard saw a
// bad dense q entry (the row is invalid).
SPECDEC_HD int64_t combine_race(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, bool& bad_q) {
  RaceBest w = race_empty(), p = race_empty();
  int64_t tok_w = -1, tok_p = -1;
  bad_q = false;
  for (int64_t r = 0; r < L.P; ++r) {
    const ShardRace s = load_race(g.at(g.plan.races(), r, b, i));
    bad_q = bad_q || s.bad_q;
    if (race_better(s.key_w, s.part_w, w)) { w = RaceBest{s.key_w, s.part_w}; tok_w = s.token_w; }
    if (race_better(s.key_p, s.part_p, p)) { p = RaceBest{s.key_p, s.part_p}; tok_p = s.token_p; }
  }
  return w.key > 0.0f ? tok_w : tok_p;
}

// What every rank concludes about row b from the global stats: the single-device walk over
// positions (cpu verify_rows) on the same numbers. NaN / +inf at any used position makes the
// row invalid (before the stop or after it); a position whose logits are all -inf only
// matters before the stop, so the walk never goes past the first one (`usable`).
struct ShardRowPlan {
  bool valid = false;    // false: invalid
  bool greedy = false;
  bool coupled = false;  // coupled (and not greedy): the stop comes from the races (finish)
  int64_t n = 0;         // drafts tested
  float inv_t = 1.0f;
  int64_t usable = 0;    // positions 0..usable-1 have a finite max
  int64_t j = -1;        // greedy / exact with sums: the stop position
  int64_t token = -1;    // greedy: the token at j (exact: from the race at j)
};

// have_sums: kSums's outputs are in g, so exact mode finds its stop (the ratio tests), with
// sum_of(i, inv_t) the global sum of position i (combine_sum, or the CUDA kernels' warp-held
// version). Without them an exact row is valid as far as kMax can tell.
template <typename SumOf>
SPECDEC_HD ShardRowPlan plan_shard_row(const ShardGathered& g, const ShardLayout& L, const VerifyParams& P,
                                       int64_t b, bool have_sums, SumOf&& sum_of) {
  ShardRowPlan plan;
  const float temperature = P.temperature.get(b);
  plan.n = P.drafts_of(b);
  if (!valid_temperature(temperature) || !valid_filter(P.filters.get(b)) || plan.n < 0 || plan.n > P.K)
    return plan;
  const int64_t* draft = P.draft_ids + b * P.K;
  for (int64_t i = 0; i < plan.n; ++i)
    if (draft[i] < 0 || draft[i] >= L.vocab()) return plan;
  plan.greedy = temperature == 0.0f;
  plan.coupled = P.coupled && !plan.greedy;
  plan.inv_t = plan.greedy ? 1.0f : 1.0f / temperature;
  plan.usable = plan.n + 1;
  for (int64_t i = plan.n; i >= 0; --i) {
    float m;
    int64_t arg;
    combine_max(g, L, b, i, m, arg);
    if (m != m || m == std::numeric_limits<float>::infinity()) return plan;
    if (!usable_max(m)) plan.usable = i;
  }
  if (plan.greedy) {
    for (int64_t i = 0; i < plan.usable && plan.j < 0; ++i) {
      float m;
      int64_t arg;
      combine_max(g, L, b, i, m, arg);
      if (i == plan.n || draft[i] != arg) { plan.j = i; plan.token = arg; }
    }
    plan.valid = plan.j >= 0;
    return plan;
  }
  if (plan.coupled || !have_sums) {
    plan.valid = true;
    return plan;
  }
  const RowRng rng = make_row_rng(P.rnd, b);
  for (int64_t i = 0; i < plan.usable && plan.j < 0; ++i) {
    bool accepted = false;
    if (i < plan.n) {
      float e_x, q_x;
      combine_draft(g, L, b, i, draft[i], e_x, q_x);
      if (bad_prob(q_x)) return plan;
      accepted = ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, sum_of(i, plan.inv_t), e_x);
    }
    if (!accepted) plan.j = i;
  }
  plan.valid = plan.j >= 0;
  return plan;
}

SPECDEC_HD ShardRowPlan plan_shard_row(const ShardGathered& g, const ShardLayout& L, const VerifyParams& P,
                                       int64_t b, bool have_sums) {
  return plan_shard_row(g, L, P, b, have_sums,
                        [&](int64_t i, float inv_t) { return combine_sum(g, L, b, i, inv_t); });
}

// The parameters of one step on one rank.
struct ShardParams {
  VerifyParams v;    // this rank's logits [B, K+1, V_r] and draft_probs [B, K, V_r]; global draft ids;
                     // tokens / num_accepted / valid: finish's outputs
  ShardLayout layout;
  int64_t rank = 0;
  int step = 0;      // the step to run (g.plan.kind[step]), or g.plan.n: finish
  ShardGathered g;   // the outputs of the steps before this one
  void* out = nullptr;  // [B, K+1, shard_step_width] float64 | int64 (shard_step_is_int)
  SPECDEC_HD int64_t vocab_start() const { return layout.start(rank); }
  SPECDEC_HD int64_t vocab_end() const { return layout.end(rank); }
  // the filter cutoff of (row b, position i) once every filter step is done (kNoCut: none)
  SPECDEC_HD float cutoff(int64_t b, int64_t i) const {
    return replay_cut(g, layout, b, i, v.filters.get(b), g.plan.sums()).cut;
  }
};

// finish of row b: the tokens (the single-device kernel's outputs for the same row), written
// when `write` (a CUDA warp computes them in every lane, one lane writes). sum_of: as in
// plan_shard_row.
template <typename SumOf>
SPECDEC_HD void finish_shard_row(const ShardParams& S, int64_t b, SumOf&& sum_of, bool write = true) {
  const VerifyParams& P = S.v;
  int64_t* tokens = P.tokens + b * (P.K + 1);
  if (write) {
    for (int64_t i = 0; i <= P.K; ++i) tokens[i] = -1;
    P.num_accepted[b] = 0;
    P.valid[b] = false;
  }
  ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, true, sum_of);
  if (!plan.valid) return;
  const int64_t* draft = P.draft_ids + b * P.K;
  bool bad_q = false;
  if (plan.coupled) {  // the stop: the first position whose own sample differs from the draft
    for (int64_t i = 0; i < plan.usable && plan.j < 0; ++i) {
      const int64_t t = combine_race(S.g, S.layout, b, i, bad_q);
      if (i == plan.n || draft[i] != t) { plan.j = i; plan.token = t; }
    }
    if (plan.j < 0) return;
  } else if (!plan.greedy) {
    plan.token = combine_race(S.g, S.layout, b, plan.j, bad_q);
    if (bad_q) return;
  }
  if (!write) return;
  for (int64_t i = 0; i < plan.j; ++i) tokens[i] = draft[i];
  tokens[plan.j] = plan.token;
  P.num_accepted[b] = plan.j;
  P.valid[b] = true;
}

SPECDEC_HD void finish_shard_row(const ShardParams& S, int64_t b) {
  finish_shard_row(S, b, [&](int64_t i, float inv_t) { return combine_sum(S.g, S.layout, b, i, inv_t); });
}

}  // namespace specdec
