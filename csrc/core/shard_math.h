// Vocabulary-parallel verify / sample: the math of a row whose logits are split over P ranks
// into contiguous vocabulary shards [bounds[r], bounds[r+1]). Framework-free; the local passes
// are the CPU kernels' own helpers (cpu/shard_kernels.h), the collectives live in Python
// (specdec_ext/distributed).
//
// A call runs four stages; after each of the first three, every rank all-gathers its stage
// output (O(B * (K+1)) values, never O(V)) and hands the P outputs to the next stage:
//   1. local max and first argmax of every used position (positions 0..n_b);
//   2. with the global max m_i: the shard's tile-sum COVER of sum_v exp((l_v - m_i) / T)
//      (core/tile_sum.h: the aligned tree blocks inside the shard), and for the draft token it
//      owns, its e = exp((l_x - m_i) / T) and q(x);
//   3. with the global sums s_i (the covers folded in rank order: the canonical tree), every
//      rank decides the same way which position needs a race (exact mode: the first rejection
//      j, by the same ratio test on the same numbers; coupled mode: every used position) and
//      runs that race on its shard: its best coarse entry (key, index) and that entry's fine
//      winner, for the residual weights and for p (the fallback);
//   4. the global winner: (key, index) by max with ties to the lower index, its fine winner.
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
  // the cover size of shard r, and the most over all shards (stage 2's width)
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

// The widths of the stage outputs (per rank, per row, per position; float64 values: a float
// or an index < 2^53).
constexpr int64_t kShardMaxWidth = 2;   // stage 1: max, first argmax (global id)
constexpr int64_t kShardRaceWidth = 7;  // stage 3: RaceEntry

SPECDEC_HD void store_max(double* out, float m, int64_t arg) {
  out[0] = m;
  out[1] = static_cast<double>(arg);
}

// Stage 2: cover values (cover_size of the rank, padded to max_cover_size), then e_x, q_x of
// the draft this rank owns (0 elsewhere).
SPECDEC_HD int64_t shard_sum_width(const ShardLayout& L) { return L.max_cover_size() + 2; }

// Stage 3 of one (row, position): a shard's best coarse entries and their fine winners.
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

// The P stage outputs of one call, each [B, K+1, width] contiguous float64.
struct ShardGathered {
  const double* const* stage[3] = {nullptr, nullptr, nullptr};  // [P] pointers per stage (nullptr: not yet)
  int64_t width[3] = {kShardMaxWidth, 0, kShardRaceWidth};
  int64_t K = 0;

  SPECDEC_HD const double* at(int s, int64_t r, int64_t b, int64_t i) const {
    return stage[s][r] + (b * (K + 1) + i) * width[s];
  }
};

// The global max (NaN if any shard saw a NaN) and first argmax of (row b, position i).
SPECDEC_HD void combine_max(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, float& m,
                            int64_t& arg) {
  m = -std::numeric_limits<float>::infinity();
  arg = 0;
  for (int64_t r = 0; r < L.P; ++r) {
    const double* s = g.at(0, r, b, i);
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

// The global sum of (row b, position i): every shard's cover, in rank order, folded into
// core/tile_sum.h's canonical tree.
SPECDEC_HD float combine_sum(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i) {
  TileSumStack sum;
  for (int64_t r = 0; r < L.P; ++r) {
    const double* s = g.at(1, r, b, i);
    const int64_t a = L.first_part(r), end = a + L.part_count(r);
    int64_t c = 0;
    for (int64_t p = a; p < end; ++c) {
      const int lv = tile_cover_level(p, end);
      sum.add_block(static_cast<float>(s[c]), lv);
      p += int64_t(1) << lv;
    }
  }
  return sum.total();
}

// e_x and q(x) of the draft x at (row b, position i), from the shard that owns x.
SPECDEC_HD void combine_draft(const ShardGathered& g, const ShardLayout& L, int64_t b, int64_t i, int64_t x,
                              float& e_x, float& q_x) {
  const double* s = g.at(1, L.owner(x), b, i);
  const int64_t w = g.width[1];
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
    const ShardRace s = load_race(g.at(2, r, b, i));
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
  bool valid = false;    // false: invalid (or, from stage 3 on, not decided: see plan_shard_row)
  bool greedy = false;
  bool coupled = false;  // coupled (and not greedy): the stop comes from the races (stage 4)
  int64_t n = 0;         // drafts tested
  float inv_t = 1.0f;
  int64_t usable = 0;    // positions 0..usable-1 have a finite max
  int64_t j = -1;        // greedy / exact with sums: the stop position
  int64_t token = -1;    // greedy: the token at j (exact: from the race at j)
};

// have_sums: stage 2's outputs are in g, so exact mode finds its stop (the ratio tests).
// Without them (stage 2 itself) an exact row is valid as far as stage 1 can tell.
SPECDEC_HD ShardRowPlan plan_shard_row(const ShardGathered& g, const ShardLayout& L, const VerifyParams& P,
                                       int64_t b, bool have_sums) {
  ShardRowPlan plan;
  const float temperature = P.temperature.get(b);
  plan.n = P.drafts_of(b);
  if (!valid_temperature(temperature) || plan.n < 0 || plan.n > P.K) return plan;
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
      accepted = ratio_test_accepts(accept_uniform(rng, static_cast<uint32_t>(i)), q_x, combine_sum(g, L, b, i), e_x);
    }
    if (!accepted) plan.j = i;
  }
  plan.valid = plan.j >= 0;
  return plan;
}

// The parameters of one stage on one rank.
struct ShardParams {
  VerifyParams v;    // this rank's logits [B, K+1, V_r] and draft_probs [B, K, V_r]; global draft ids;
                     // tokens / num_accepted / valid: stage 4's outputs
  ShardLayout layout;
  int64_t rank = 0;
  int stage = 1;     // 1..3: out [B, K+1, width[stage - 1]]; 4: v.tokens, v.num_accepted, v.valid
  ShardGathered g;   // the outputs of the stages before this one
  double* out = nullptr;
  SPECDEC_HD int64_t vocab_start() const { return layout.start(rank); }
  SPECDEC_HD int64_t vocab_end() const { return layout.end(rank); }
};

// Stage 4 of row b: the tokens (the single-device kernel's outputs for the same row).
SPECDEC_HD void finish_shard_row(const ShardParams& S, int64_t b) {
  const VerifyParams& P = S.v;
  int64_t* tokens = P.tokens + b * (P.K + 1);
  for (int64_t i = 0; i <= P.K; ++i) tokens[i] = -1;
  P.num_accepted[b] = 0;
  P.valid[b] = false;
  ShardRowPlan plan = plan_shard_row(S.g, S.layout, P, b, true);
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
  for (int64_t i = 0; i < plan.j; ++i) tokens[i] = draft[i];
  tokens[plan.j] = plan.token;
  P.num_accepted[b] = plan.j;
  P.valid[b] = true;
}

}  // namespace specdec
