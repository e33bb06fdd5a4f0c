// Top-k / top-p / min-p filtering of one row position, framework-free and shared
// by the CPU and CUDA kernels and the scalar reference.
//
// Semantics (Hugging Face generate's warper order), for one position with raw
// logits l[v], its max m, inverse temperature a and e[v] = shifted_exp(l[v], m, a)
// (verify_math.h; e = 1 at the max, so e[v] = p[v] / max p):
//   1. top-k (k >= 1): keep v iff l[v] >= the k-th largest logit (ties at the
//      boundary are kept; k >= V keeps everything);
//   2. top-p (0 < p <= 1), on the renormalised top-k survivors: keep v iff the
//      mass of survivors with a strictly higher logit is < p * (mass of all
//      survivors);
//   3. min-p (0 <= min_p < 1): keep v iff e[v] >= min_p, i.e. p(v) >= min_p * max p
//      (renormalising after steps 1-2 does not change the ratio to the max).
// Every step keeps an upper set of logit values, so the result is ONE cutoff c:
// token v survives iff l[v] >= c (c = -inf: no filter). The max always survives
// (top-k >= 1; mass above the max is 0 < p; e = 1 >= min_p), so a filtered row
// is never empty. The kernels then treat every l[v] < c as -inf: the max is
// unchanged and the softmax, ratio test and races renormalise over the
// survivors by themselves (filtered_logit).
//
// No sort. The cutoffs are found by MSB-first radix selection over order_key(l),
// a 32-bit key with the order of the floats, 8 bits per pass:
//   top-k: 4 counting passes (histogram of 256 counts over the keys that match
//          the prefix found so far; walk the digits down until k is reached);
//   top-p: 4 mass passes (the same, with a histogram of masses); the first pass
//          also gives the survivors' total mass;
//   min-p: 1 pass (the smallest logit with e >= min_p).
// i.e. at most 9 passes over a row position, and none when no filter is on.
// Masses are summed in 2^-40 fixed point (uint64): integer sums are exact and
// associative, so the cutoff does not depend on the order of summation (CPU
// vectorisation, CUDA thread count) and every backend finds the same one. A
// token with e < 2^-40 weighs 0 in the top-p sums (its probability is below
// 1e-12 of the max); V must be < 2^23 so a row's mass fits in 63 bits.
#pragma once
#include <cstdint>
#include <cstring>
#include <limits>

#include "macros.h"
#include "verify_math.h"

namespace specdec {

// The filters of one row; "off" values: top_k 0, top_p 1, min_p 0.
struct FilterSpec {
  int64_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

SPECDEC_HD bool valid_filter(const FilterSpec& f) {
  return f.top_k >= 0 && f.top_p > 0.0f && f.top_p <= 1.0f && f.min_p >= 0.0f && f.min_p < 1.0f;
}

// Whether any filter can remove a token of a V-token row.
SPECDEC_HD bool filter_on(const FilterSpec& f, int64_t V) {
  return (f.top_k > 0 && f.top_k < V) || f.top_p < 1.0f || f.min_p > 0.0f;
}

constexpr int64_t kMaxFilterVocab = int64_t(1) << 23;
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kRadixPasses = 32 / kRadixBits;

// A 32-bit key with the order of the (non-NaN) floats: -inf smallest, +inf largest.
SPECDEC_HD uint32_t order_key(float x) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, sizeof(u));
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

SPECDEC_HD float key_to_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// e in [0, 1] in 2^-40 fixed point (truncated). Via int64: e * 2^40 <= 2^40, and a
// float -> int64 conversion is one instruction where float -> uint64 is not.
SPECDEC_HD uint64_t fixed_mass(float e) {
  return static_cast<uint64_t>(static_cast<int64_t>(e * 1099511627776.0f));
}

// A logit as the filtered row reads it: -inf below the cutoff.
SPECDEC_HD float filtered_logit(float x, float cutoff) {
  return x >= cutoff ? x : -std::numeric_limits<float>::infinity();
}

// The radix-select state of one search: the key bits found so far (`prefix`, the
// top `bits` bits of the answer). A key is in the current bucket iff its top
// `bits` bits equal the prefix.
struct RadixState {
  uint32_t prefix = 0;
  int bits = 0;
  SPECDEC_HD bool in_bucket(uint32_t key) const { return bits == 0 || (key >> (32 - bits)) == prefix; }
  SPECDEC_HD int digit(uint32_t key) const { return static_cast<int>((key >> (32 - bits - kRadixBits)) & (kRadixBins - 1)); }
  SPECDEC_HD void descend(int d) {
    prefix = (prefix << kRadixBits) | static_cast<uint32_t>(d);
    bits += kRadixBits;
  }
  SPECDEC_HD bool done() const { return bits == 32; }
};

// top-k step: count[d] = keys of the bucket with digit d; k_left = how many of the
// largest keys are still to be passed (>= 1). Picks the digit holding the k-th
// largest key and subtracts the counts of the digits above it.
SPECDEC_HD int topk_digit(const uint32_t* count, int64_t& k_left) {
  for (int d = kRadixBins - 1; d > 0; --d) {
    if (static_cast<int64_t>(count[d]) >= k_left) return d;
    k_left -= count[d];
  }
  return 0;
}

// top-p step: mass[d], count[d] of the bucket's keys (survivors of top-k only);
// above = the mass of survivors with a key above the bucket; limit = p * total
// mass. Picks the LOWEST non-empty digit whose mass above is < limit (the answer
// is the smallest key whose strictly-higher mass is < limit, and the top key of
// that digit qualifies), and advances `above` to that digit's mass above.
SPECDEC_HD int topp_digit(const uint64_t* mass, const uint32_t* count, uint64_t& above, double limit) {
  int pick = -1;
  uint64_t pick_above = above, run = above;
  for (int d = kRadixBins - 1; d >= 0; --d) {
    if (count[d] == 0) continue;
    if (!(static_cast<double>(run) < limit)) break;
    pick = d;
    pick_above = run;
    run += mass[d];
  }
  above = pick_above;
  return pick < 0 ? 0 : pick;
}

// p * total in the units of fixed_mass, as the top-p comparisons use it.
SPECDEC_HD double topp_limit(float top_p, uint64_t total) {
  return static_cast<double>(top_p) * static_cast<double>(total);
}

SPECDEC_HD float max_cutoff(float a, float b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------
// Scalar reference: the cutoff of one row position over a float array (row [V],
// finite max m, usable inverse temperature inv_t). The kernels compute the same
// passes or equivalent ones (CPU: a one-pass candidate buffer for top-k, a binned
// pass then radix passes over one bin for top-p; CUDA: block-wide histograms) and
// get the same cutoff: every decision depends only on float order and integer sums.
// ---------------------------------------------------------------------------
inline float filter_cutoff_reference(const float* row, int64_t V, float m, float inv_t, const FilterSpec& f) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float cut = ninf;  // the top-k cutoff first: top-p runs on the tokens >= it (float order)
  if (f.top_k > 0 && f.top_k < V) {
    RadixState s;
    int64_t k_left = f.top_k;
    while (!s.done()) {
      uint32_t count[kRadixBins] = {};
      for (int64_t v = 0; v < V; ++v) {
        const uint32_t key = order_key(row[v]);
        if (s.in_bucket(key)) ++count[s.digit(key)];
      }
      s.descend(topk_digit(count, k_left));
    }
    cut = key_to_float(s.prefix);
  }
  if (f.top_p < 1.0f) {
    RadixState s;
    uint64_t above = 0;
    double limit = 0.0;
    while (!s.done()) {
      uint32_t count[kRadixBins] = {};
      uint64_t mass[kRadixBins] = {};
      for (int64_t v = 0; v < V; ++v) {
        const uint32_t key = order_key(row[v]);
        if (row[v] < cut || !s.in_bucket(key)) continue;
        const int d = s.digit(key);
        ++count[d];
        mass[d] += fixed_mass(shifted_exp(row[v], m, inv_t));
      }
      if (s.bits == 0) {
        uint64_t total = 0;
        for (int d = 0; d < kRadixBins; ++d) total += mass[d];
        limit = topp_limit(f.top_p, total);
      }
      s.descend(topp_digit(mass, count, above, limit));
    }
    cut = max_cutoff(cut, key_to_float(s.prefix));
  }
  if (f.min_p > 0.0f) {
    float lo = m;
    for (int64_t v = 0; v < V; ++v)
      if (row[v] < lo && shifted_exp(row[v], m, inv_t) >= f.min_p) lo = row[v];
    cut = max_cutoff(cut, lo);
  }
  return cut;
}

}  // namespace specdec
