// The tree rules of core/tree_params.h: parent entries, depths, child order, and the
// residual test's boundary (strict: r(x) = u * q(x) * Z is a rejection).
#include <gtest/gtest.h>

#include <vector>

#include "core/tree_params.h"

namespace specdec {
namespace {

TEST(Tree, ParentEntries) {
  const std::vector<int64_t> ok{-1, 0, 0, 1, 1, 2};
  for (int64_t n = 0; n < static_cast<int64_t>(ok.size()); ++n) EXPECT_TRUE(valid_parent(ok.data(), n)) << n;
  const std::vector<int64_t> root_with_parent{0, 0};
  EXPECT_FALSE(valid_parent(root_with_parent.data(), 0));
  const std::vector<int64_t> forward{-1, 1, 3, 0};  // node 1 its own parent, node 2 a later one
  EXPECT_FALSE(valid_parent(forward.data(), 1));
  EXPECT_FALSE(valid_parent(forward.data(), 2));
  EXPECT_TRUE(valid_parent(forward.data(), 3));
  const std::vector<int64_t> negative{-1, -1};
  EXPECT_FALSE(valid_parent(negative.data(), 1));
}

TEST(Tree, DepthsAndChildren) {
  // root -> 1, 2; 1 -> 3, 4; 4 -> 5
  const std::vector<int64_t> p{-1, 0, 0, 1, 1, 4};
  const int64_t N = static_cast<int64_t>(p.size());
  const std::vector<int64_t> depth{0, 1, 1, 2, 2, 3};
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(node_depth(p.data(), n), depth[n]) << n;
  std::vector<int64_t> kids;
  for (int64_t c = next_child(p.data(), N, 1, 1); c >= 0; c = next_child(p.data(), N, 1, c)) kids.push_back(c);
  EXPECT_EQ(kids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(next_child(p.data(), N, 0, 0), 1);
  EXPECT_EQ(next_child(p.data(), N, 0, 2), -1);  // no child of the root after node 2
  EXPECT_EQ(next_child(p.data(), N, 5, 5), -1);  // a leaf
}

TEST(Tree, ChildRandomNumbersAreVerifyPositions) {
  // child c of a chain is draft c - 1 of verify: the same accept uniform
  EXPECT_EQ(child_position(1), 0u);
  EXPECT_EQ(child_position(7), 6u);
}

TEST(Tree, ResidualTestIsStrict) {
  EXPECT_TRUE(residual_test_accepts(0.25f, 1.0f, 2.0f, 0.6f));   // 0.5 < 0.6
  EXPECT_FALSE(residual_test_accepts(0.25f, 1.0f, 2.0f, 0.5f));  // 0.5 == 0.5: rejected
  EXPECT_FALSE(residual_test_accepts(0.0f, 1.0f, 1.0f, 0.0f));   // r(x) = 0 is never accepted
}

}  // namespace
}  // namespace specdec
