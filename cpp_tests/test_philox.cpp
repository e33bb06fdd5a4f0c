// Philox4x32-10 against the published Random123 known-answer vectors, and the
// properties of our uniform / exponential conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/rng.h"

namespace {

struct Kat {
  uint32_t ctr[4], key[2], out[4];
};

std::vector<Kat> load_kats() {
  std::ifstream in(SPECDEC_KAT_FILE);
  std::vector<Kat> kats;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Kat k{};
    unsigned v[10];
    if (std::sscanf(line.c_str(), "%x %x %x %x %x %x -> %x %x %x %x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                    &v[6], &v[7], &v[8], &v[9]) != 10)
      continue;
    for (int i = 0; i < 4; ++i) k.ctr[i] = v[i], k.out[i] = v[6 + i];
    k.key[0] = v[4];
    k.key[1] = v[5];
    kats.push_back(k);
  }
  return kats;
}

TEST(Philox, KnownAnswerVectors) {
  const auto kats = load_kats();
  ASSERT_EQ(kats.size(), 3u) << "could not read " << SPECDEC_KAT_FILE;
  for (const Kat& k : kats) {
    const specdec::Philox4 r =
        specdec::philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.x[i], k.out[i]) << "word " << i;
  }
}

TEST(Philox, CounterAndKeyChangeTheOutput) {
  const auto a = specdec::philox4x32_10(0, 0, 0, 0, 1, 2);
  const auto b = specdec::philox4x32_10(1, 0, 0, 0, 1, 2);
  const auto c = specdec::philox4x32_10(0, 0, 0, 0, 1, 3);
  EXPECT_NE(a.x[0], b.x[0]);
  EXPECT_NE(a.x[0], c.x[0]);
}

TEST(Uniform, OpenIntervalAtTheExtremes) {
  EXPECT_GT(specdec::uniform_open01(0u), 0.0f);
  EXPECT_LT(specdec::uniform_open01(0xFFFFFFFFu), 1.0f);
  EXPECT_GT(specdec::exponential_from_bits(0xFFFFFFFFu), 0.0f);
  EXPECT_TRUE(std::isfinite(specdec::exponential_from_bits(0u)));
  // Every 23-bit level maps to a distinct float: the conversion is exact.
  EXPECT_NE(specdec::uniform_open01(0xFFFFFFFFu), specdec::uniform_open01(0xFFFFFDFFu));
}

TEST(Uniform, MeanAndVarianceOfManyDraws) {
  const specdec::RowRng rng(42, 0);
  double sum = 0, sum2 = 0, esum = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n / 4; ++i) {
    const auto r = rng.block(specdec::kStreamVerifyRace, 0, static_cast<uint32_t>(i));
    for (int k = 0; k < 4; ++k) {
      const double u = specdec::uniform_open01(r.x[k]);
      sum += u;
      sum2 += u * u;
      esum += specdec::exponential_from_bits(r.x[k]);
    }
  }
  // Standard errors: mean 1/sqrt(12 n) ~ 2.8e-4; 6 sigma bounds.
  EXPECT_NEAR(sum / n, 0.5, 6 * 2.9e-4);
  EXPECT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 1e-3);
  EXPECT_NEAR(esum / n, 1.0, 6 * 1.0 / std::sqrt(double(n)));
}

TEST(RowKey, PerRowSeedIsUsedAsGivenAndBatchSeedMixesTheRow) {
  EXPECT_EQ(specdec::row_key(77, 5, true), 77u);
  EXPECT_NE(specdec::row_key(77, 5, false), specdec::row_key(77, 6, false));
  EXPECT_NE(specdec::row_key(77, 5, false), specdec::row_key(78, 5, false));
}

}  // namespace
