// ShardLayout: the data-parallel partition of the flat optimizer state covers every element of
// every param exactly once, in contiguous per-rank ranges, for any group size; checked against
// a per-element walk (the slow, obvious reference).
#include <gtest/gtest.h>

#include <vector>

#include "harness/optim/shard_layout.h"

using rh::optim::ShardLayout;

namespace {

struct Sizes {
  std::vector<int64_t> numels;
  int world;
};

class ShardLayoutCover : public ::testing::TestWithParam<Sizes> {};

TEST_P(ShardLayoutCover, EveryElementExactlyOnceInContiguousRanges) {
  const auto& [numels, world] = GetParam();
  std::vector<std::vector<int>> owner(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) owner[i].assign(static_cast<size_t>(numels[i]), -1);
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  for (int r = 0; r < world; ++r) {
    const auto L = ShardLayout::make(numels, r, world);
    EXPECT_EQ(L.total, total);
    EXPECT_LE(L.hi(r) - L.lo(r), L.shard);
    EXPECT_EQ(L.lo(r), std::min<int64_t>(total, r * L.shard));
    for (size_t i = 0; i < numels.size(); ++i) {
      const auto [b, e] = L.piece(i);
      ASSERT_LE(0, b);
      ASSERT_LE(b, e);
      ASSERT_LE(e, numels[i]);
      for (int64_t j = b; j < e; ++j) {
        EXPECT_EQ(owner[i][static_cast<size_t>(j)], -1) << "param " << i << " element " << j << " owned twice";
        owner[i][static_cast<size_t>(j)] = r;
        EXPECT_EQ(L.owner(L.offsets[i] + j), r);
      }
    }
  }
  // Reference: element k of the flat space belongs to rank k / ceil(total / world).
  const int64_t shard = (total + world - 1) / world;
  int64_t flat = 0;
  const auto L0 = ShardLayout::make(numels, 0, world);
  for (size_t i = 0; i < numels.size(); ++i) {
    bool spans = false;
    for (int64_t j = 0; j < numels[i]; ++j, ++flat) {
      EXPECT_EQ(owner[i][static_cast<size_t>(j)], static_cast<int>(flat / shard)) << "param " << i << " element " << j;
      spans = spans || owner[i][static_cast<size_t>(j)] != owner[i][0];
    }
    EXPECT_EQ(L0.is_split(i), spans) << "param " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardLayoutCover,
                         ::testing::Values(Sizes{{10}, 1}, Sizes{{10}, 3}, Sizes{{7, 1, 9, 4}, 2}, Sizes{{7, 1, 9, 4}, 4},
                                           Sizes{{5, 0, 5}, 4}, Sizes{{3}, 5}, Sizes{{100, 28, 3001, 17}, 3},
                                           Sizes{{4096, 4096, 1}, 8}));

TEST(ShardLayout, RejectsBadGroups) {
  EXPECT_THROW(ShardLayout::make({4}, 0, 0), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4}, -1, 2), std::invalid_argument);
}

}  // namespace
