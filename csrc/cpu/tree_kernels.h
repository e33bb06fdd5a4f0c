// CPU kernel of specdec::verify_tree (the walk: core/tree_params.h) over raw
// pointers, built on the per-position helpers of sampling_kernels.h (same
// CPU_CAPABILITY namespace).
//
// One row per worker (for_each_row). Every node's logits get a max pass (NaN /
// +inf anywhere makes the row invalid, as in verify); the visited nodes then get
// verify's per-position work: max, filter cutoff, filtered softmax sum. The
// residual law after a rejected child is held in a row buffer w[V] with r = w / Z
// (two buffers: a candidate residual of mass 0 leaves r as it was). The first
// child of a node is tested on p' without a buffer, and the buffer holds exactly
// verify's race weights (p' - q clamped, or p' with the draft zeroed), so a
// chain-shaped tree gives verify's tokens.
#pragma once
#include <utility>
#include <vector>

#include "../core/tree_params.h"
#include "sampling_kernels.h"

namespace specdec {
namespace cpu {
namespace CPU_CAPABILITY {

// The two-level race of verify_math.h over explicit weights w[V] >= 0 (the verify race
// streams at `position`): the token, or -1 when every tile weighs 0.
inline int64_t race_buffer(const float* w, int64_t V, const RowRng& rng, uint32_t position) {
  RaceBest tile = race_empty();
  for (int64_t t = 0; t * kRaceTile < V; ++t) {
    const int64_t v0 = t * kRaceTile, n = std::min(kRaceTile, V - v0);
    const float key = vec_sum(w + v0, n) / race_exponential(rng, kStreamVerifyTile, position, t);
    if (race_better(key, t, tile)) tile = RaceBest{key, t};
  }
  if (!(tile.key > 0.0f)) return -1;
  const int64_t v0 = tile.index * kRaceTile, n = std::min(kRaceTile, V - v0);
  alignas(64) float E[kRaceTile];
  race_exponentials(rng, kStreamVerifyRace, position, v0, n, E);
  RaceBest best = race_empty();
  for (int64_t k = 0; k < n; ++k)
    if (race_better(w[v0 + k] / E[k], v0 + k, best)) best = RaceBest{w[v0 + k] / E[k], v0 + k};
  return best.index;
}

// The residual law of one node between its children: r = w / Z over a row buffer.
// `cur` holds r once `held` (before the first rejection r is p' = e / s, not stored).
struct Residual {
  std::vector<float>* cur;
  std::vector<float>* next;
  float Z = 0.0f;
  bool held = false;
};

// One visited, non-greedy node: the filtered row (max m, cut, sum s) and its q row.
template <typename TL, typename TQ>
struct TreeNode {
  const TL* row;
  const TQ* q;  // q_n, or nullptr (deterministic children)
  int64_t V;
  float inv_t, cut;
  SoftmaxStats st;

  // out[v] = p'(v) = e_v / s, the bonus / fallback weights (verify's p).
  void fill_p(float* out) const {
    with_unit_t(inv_t, [&](auto unit_t) {
      alignas(64) float buf[kTile];
      const float inv_s = 1.0f / st.sum;
      const Vec va(inv_t), vm(st.max), vis(inv_s);
      for (int64_t v0 = 0; v0 < V; v0 += kTile) {
        const int64_t n = std::min(kTile, V - v0);
        const float* x = tile_as_float(row, v0, n, buf, cut);
        int64_t k = 0;
        for (; k + Vec::size() <= n; k += Vec::size())
          (shifted_exp_vec<decltype(unit_t)::value>(Vec::loadu(x + k), vm, va) * vis).store(out + v0 + k);
        for (; k < n; ++k) out[v0 + k] = shifted_exp(x[k], st.max, inv_t) * inv_s;
      }
    });
  }

  // out = max(0, r - q) with r = src / Z (src == nullptr: r = p', verify's residual
  // weights exactly); false when q holds a bad probability.
  bool fill_residual(const float* src, float Z, float* out) const {
    if (!src) fill_p(out);
    const float scale = src ? 1.0f / Z : 1.0f;
    const float* r = src ? src : out;
    alignas(64) float qbuf[kTile];
    const Vec vs(scale), zero(0.0f);
    Vec qmin(0.0f), qmax(0.0f);
    bool ok = true;
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t n = std::min(kTile, V - v0);
      const float* qv = tile_as_float(q, v0, n, qbuf);
      int64_t k = 0;
      for (; k + Vec::size() <= n; k += Vec::size()) {
        const Vec vq = Vec::loadu(qv + k);
        qmin = at::vec::minimum(qmin, vq);
        qmax = at::vec::maximum(qmax, vq);
        Vec rv = Vec::loadu(r + v0 + k);
        if (src) rv = rv * vs;
        at::vec::maximum(rv - vq, zero).store(out + v0 + k);
      }
      for (; k < n; ++k) {
        ok = ok && !bad_prob(qv[k]);
        const float w = (src ? r[v0 + k] * scale : r[v0 + k]) - qv[k];
        out[v0 + k] = w > 0.0f ? w : 0.0f;
      }
    }
    return ok && !bad_prob(hmin(qmin)) && !bad_prob(hmax(qmax));
  }
};

// Rejects child token x at a node: updates the residual. False: a bad q entry.
template <typename TL, typename TQ>
inline bool reject_child(const TreeNode<TL, TQ>& nd, int64_t x, Residual& r) {
  const int64_t V = nd.V;
  float* next = r.next->data();
  if (nd.q) {
    if (!nd.fill_residual(r.held ? r.cur->data() : nullptr, r.Z, next)) return false;
  } else {
    if (r.held) std::copy(r.cur->begin(), r.cur->end(), next);
    else nd.fill_p(next);
    next[x] = 0.0f;  // verify's one-hot residual: p' with the draft zeroed
  }
  const float Z = vec_sum(next, V);
  if (Z > 0.0f) {
    std::swap(r.cur, r.next);
    r.Z = Z;
  } else if (!r.held) {  // r == q: keep r = p'
    nd.fill_p(r.cur->data());
    r.Z = vec_sum(r.cur->data(), V);
  }
  r.held = true;
  return true;
}

template <typename TL, typename TQ>
void verify_tree_rows(const TreeVerifyParams& P) {
  for_each_row(P.B, [&](int64_t b) {
    const int64_t N = P.N, V = P.V, D1 = P.depth + 1;
    int64_t* tokens = P.tokens + b * D1;
    int64_t* path = P.path + b * D1;
    std::fill(tokens, tokens + D1, int64_t{-1});
    std::fill(path, path + D1, int64_t{-1});
    P.num_accepted[b] = 0;
    P.valid[b] = false;

    const float temperature = P.temperature.get(b);
    const FilterSpec filter = P.filters.get(b);
    if (!valid_temperature(temperature) || !valid_filter(filter)) return;
    const int64_t* parents = P.parents_of(b);
    const int64_t* ids = P.token_ids + b * N;
    const TL* logits = static_cast<const TL*>(P.logits) + b * P.logits_stride_b;
    for (int64_t n = 0; n < N; ++n) {
      if (!valid_parent(parents, n) || node_depth(parents, n) > P.depth) return;
      if (n > 0 && (ids[n] < 0 || ids[n] >= V)) return;
      float m;
      int64_t arg;
      row_max(logits + n * P.logits_stride_n, V, false, m, arg);
      if (bad_logit(m)) return;  // NaN / +inf at any node
    }

    const bool greedy = temperature == 0.0f;
    const float inv_t = greedy ? 1.0f : 1.0f / temperature;
    const RowRng rng = make_row_rng(P.rnd, b);
    const TQ* probs = P.draft_probs ? static_cast<const TQ*>(P.draft_probs) + b * P.probs_stride_b : nullptr;
    thread_local std::vector<float> buf_a, buf_b;
    int64_t node = 0, depth = 0, token = -1;
    // the walk; false: the row is invalid (a visited node without a distribution, a bad q)
    auto walk = [&]() -> bool {
    path[0] = 0;
    while (token < 0) {
      const TL* row = logits + node * P.logits_stride_n;
      float m, topk_cut;
      int64_t arg;
      const bool fuse = !greedy && topk_cuts(filter, V);
      position_max(row, V, greedy, fuse, filter, m, arg, topk_cut);
      if (!usable_max(m)) return false;  // all -inf at a visited node: no distribution
      int64_t accepted = -1;
      if (greedy) {
        for (int64_t c = next_child(parents, N, node, node); c >= 0 && accepted < 0; c = next_child(parents, N, node, c))
          if (ids[c] == arg) accepted = c;
        if (accepted < 0) token = arg;
      } else {
        TreeNode<TL, TQ> nd{row, probs ? probs + node * P.probs_stride_n : nullptr, V, inv_t, 0.0f, {}};
        nd.st = filtered_stats(row, V, m, inv_t, filter, nd.cut, fuse ? &topk_cut : nullptr);
        buf_a.resize(V);
        buf_b.resize(V);
        Residual r{&buf_a, &buf_b};
        for (int64_t c = next_child(parents, N, node, node); c >= 0; c = next_child(parents, N, node, c)) {
          const int64_t x = ids[c];
          const float q_x = nd.q ? static_cast<float>(nd.q[x]) : 1.0f;
          if (bad_prob(q_x)) return false;
          const float u = accept_uniform(rng, child_position(c));
          const bool ok = r.held ? residual_test_accepts(u, q_x, r.Z, (*r.cur)[x])
                                 : ratio_test_accepts(u, q_x, nd.st.sum,
                                                      shifted_exp(filtered_logit(static_cast<float>(row[x]), nd.cut),
                                                                  m, inv_t));
          if (ok) {
            accepted = c;
            break;
          }
          if (!reject_child(nd, x, r)) return false;
        }
        if (accepted < 0) {  // the correction from r, or the bonus from p' at a leaf
          if (!r.held) nd.fill_p(r.cur->data());
          token = race_buffer(r.cur->data(), V, rng, static_cast<uint32_t>(node));
          if (token < 0) {  // every weight rounded to 0: verify's fallback, the race on p'
            nd.fill_p(r.cur->data());
            token = race_buffer(r.cur->data(), V, rng, static_cast<uint32_t>(node));
          }
          if (token < 0) return false;
        }
      }
      if (accepted >= 0) {
        tokens[depth] = ids[accepted];
        path[++depth] = accepted;
        node = accepted;
      }
    }
    return true;
    };
    if (!walk()) {
      std::fill(tokens, tokens + D1, int64_t{-1});
      std::fill(path, path + D1, int64_t{-1});
      return;
    }
    tokens[depth] = token;
    P.num_accepted[b] = depth;
    P.valid[b] = true;
  });
}

inline void verify_tree(const TreeVerifyParams& P, DType logits_dtype, DType probs_dtype) {
  dispatch_dtypes<CpuTypes>(logits_dtype, probs_dtype, [&](auto tl, auto tq) {
    verify_tree_rows<typename decltype(tl)::type, typename decltype(tq)::type>(P);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace specdec
