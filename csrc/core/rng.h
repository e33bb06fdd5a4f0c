// How every random number of the sampling ops is keyed. One place, so the CPU
// and CUDA kernels draw bit-identical numbers for the same (seed, offset).
//
//   Philox key     = 64-bit row key (see row_key)
//   Philox counter = { index, position | stream << 24, offset_lo, offset_hi }
//
// `index` is the draw number (ratio-test uniform: 0), the vocabulary group v / 4
// (one Philox block gives the exponentials of 4 consecutive tokens) or the tile
// group t / 4 of the coarse race (see verify_math.h). `position` is the draft
// position 0..K (K < 2^24). Streams keep every kind of draw apart.
#pragma once
#include <cmath>
#include <cstdint>

#include "macros.h"
#include "philox.h"

namespace specdec {

enum RngStream : uint32_t {
  kStreamAcceptUniform = 0,  // verify: u_i of the ratio test at position i
  kStreamVerifyRace = 1,     // verify: token exponentials E_v of residual / bonus sampling
  kStreamSampleRace = 2,     // sample: token exponentials E_v of the draft-step sampler
  kStreamVerifyTile = 3,     // verify: tile exponentials of the coarse race
  kStreamSampleTile = 4,     // sample: tile exponentials of the coarse race
  kStreamVerifyPart = 5,     // vocab-parallel verify: coarse-race exponential of a part that starts
                             // inside a tile (index = its first token; core/shard_math.h)
  kStreamSamplePart = 6,     // the same for sample (and coupled verify)
};

constexpr int64_t kMaxPositions = (int64_t(1) << 24);

SPECDEC_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Per-row key. A per-request seed (seed tensor [B]) is used as given, so a row's
// randomness does not depend on its place in the batch. A batch-wide seed (int
// or 0-dim tensor) is mixed with the row index so every row gets its own stream.
SPECDEC_HD uint64_t row_key(uint64_t seed, int64_t row, bool per_row_seed) {
  return per_row_seed ? seed
                      : splitmix64(seed ^ splitmix64(static_cast<uint64_t>(row) + 1));
}

struct RowRng {
  uint32_t k0, k1;        // Philox key
  uint32_t off_lo, off_hi;  // caller's offset: advance it to get fresh numbers

  SPECDEC_HD RowRng(uint64_t key, uint64_t offset)
      : k0(static_cast<uint32_t>(key)), k1(static_cast<uint32_t>(key >> 32)),
        off_lo(static_cast<uint32_t>(offset)), off_hi(static_cast<uint32_t>(offset >> 32)) {}

  // The same key with the offset advanced by n (mod 2^64): coupled verify keys the
  // target's own sample at verified position i by offset + i (verify_math.h).
  SPECDEC_HD RowRng advanced(uint64_t n) const {
    RowRng r = *this;
    const uint64_t off = ((static_cast<uint64_t>(off_hi) << 32) | off_lo) + n;
    r.off_lo = static_cast<uint32_t>(off);
    r.off_hi = static_cast<uint32_t>(off >> 32);
    return r;
  }

  SPECDEC_HD Philox4 block(uint32_t stream, uint32_t position, uint32_t index) const {
    return philox4x32_10(index, position | (stream << 24), off_lo, off_hi, k0, k1);
  }
};

// 23 random bits -> uniform in the OPEN interval (0, 1): (k + 0.5) / 2^23 with
// k < 2^23 needs 24 significant bits, so it is exact in float32 and lies in
// [2^-24, 1 - 2^-24]: never 0 or 1. Hence u * q < p never accepts p == 0, and
// the exponential -log(u) is finite and > 0 (a race key w / E is never inf/NaN).
SPECDEC_HD float uniform_open01(uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Exponential(1) from 23 random bits: E = -log(u), E in [6e-8, 16.7].
SPECDEC_HD float exponential_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return -logf(uniform_open01(bits));
#else
  return -std::log(uniform_open01(bits));
#endif
}

// The ratio-test uniform of draft position `position`.
SPECDEC_HD float accept_uniform(const RowRng& rng, uint32_t position) {
  return uniform_open01(rng.block(kStreamAcceptUniform, position, 0).x[0]);
}

// Word k (0..3) of a Philox block, chosen by selects: a run-time index into
// r.x would put the array in (slow) local memory on the GPU.
SPECDEC_HD uint32_t philox_word(const Philox4& r, int64_t k) {
  const uint32_t lo = (k & 1) ? r.x[1] : r.x[0], hi = (k & 1) ? r.x[3] : r.x[2];
  return (k & 2) ? hi : lo;
}

// The exponential of entry v (a token, or a tile of the coarse race) for a race
// at `position` on `stream`.
SPECDEC_HD float race_exponential(const RowRng& rng, uint32_t stream, uint32_t position,
                                  int64_t v) {
  const Philox4 r = rng.block(stream, position, static_cast<uint32_t>(v >> 2));
  return exponential_from_bits(philox_word(r, v & 3));
}

}  // namespace specdec
