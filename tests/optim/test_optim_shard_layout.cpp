// ShardLayout: Megatron's distributed-optimizer buffer layout. Checked against
//  - an independent transliteration of upstream's rule with a slow element-by-element walk
//    (tests/megatron_layout_reference.py, run by this test), offsets, buckets and every rank's
//    piece of every param;
//  - the invariants any such layout must keep (every element exactly once, equal shares, buckets
//    divisible by lcm(dp, 128), owner / local_index consistent with the pieces).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "tests/python_reference.h"
#include "harness/optim/shard_layout.h"

using rh::optim::BufferOptions;
using rh::optim::ShardLayout;

namespace {

const nlohmann::json& layout_reference() {
  return rh::testing::python_reference("megatron_layout_reference.py", "megatron_layout_reference.json");
}

constexpr int kCases = 14;   // tests/megatron_layout_reference.py CASES

class MegatronLayout : public ::testing::TestWithParam<int> {};

TEST_P(MegatronLayout, EqualsUpstreamsRuleWalkedElementByElement) {
  ASSERT_EQ(layout_reference().size(), static_cast<size_t>(kCases)) << "update kCases with the script's CASES";
  const auto& c = layout_reference().at(static_cast<size_t>(GetParam()));
  const auto numels = c.at("numels").get<std::vector<int64_t>>();
  const int dp = c.at("dp").get<int>();
  const BufferOptions bo{c.at("bucket_size").get<int64_t>(), c.at("busbw").get<bool>()};
  SCOPED_TRACE(c.dump());
  for (int r = 0; r < dp; ++r) {
    const auto L = ShardLayout::make(numels, r, dp, bo);
    EXPECT_EQ(L.offsets, c.at("offsets").get<std::vector<int64_t>>());
    EXPECT_EQ(L.bucket_of, c.at("bucket_of").get<std::vector<int>>());
    std::vector<std::vector<int64_t>> buckets;
    for (const auto& [b, e] : L.buckets) buckets.push_back({b, e});
    EXPECT_EQ(buckets, c.at("buckets").get<std::vector<std::vector<int64_t>>>());
    EXPECT_EQ(L.bucket_numel_unpadded, c.at("per_bucket_numel_unpadded").get<std::vector<int64_t>>());
    for (size_t i = 0; i < numels.size(); ++i) {
      const auto [b, e] = L.piece(i);
      const auto want = c.at("pieces").at(static_cast<size_t>(r)).at(i).get<std::vector<int64_t>>();
      EXPECT_EQ((std::vector<int64_t>{b, e}), want) << "rank " << r << " param " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MegatronLayout, ::testing::Range(0, kCases));

struct Sizes {
  std::vector<int64_t> numels;
  int world;
  int64_t bucket_size;
};

class ShardLayoutCover : public ::testing::TestWithParam<Sizes> {};

TEST_P(ShardLayoutCover, EveryElementExactlyOnceInEqualShares) {
  const auto& [numels, world, bucket_size] = GetParam();
  std::vector<std::vector<int>> owner(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) owner[i].assign(static_cast<size_t>(numels[i]), -1);
  std::set<std::pair<int, int64_t>> local_seen;
  for (int r = 0; r < world; ++r) {
    const auto L = ShardLayout::make(numels, r, world, {bucket_size, false});
    EXPECT_EQ(L.total % world, 0);
    for (const auto& [b, e] : L.buckets) EXPECT_EQ((e - b) % std::lcm(int64_t{world}, int64_t{128}), 0);
    int64_t share = 0;
    for (const auto& [lo, hi] : L.ranges(r)) share += hi - lo;
    EXPECT_EQ(share, L.per_rank());
    for (size_t i = 0; i < numels.size(); ++i) {
      const auto [b, e] = L.piece(i);
      ASSERT_LE(0, b);
      ASSERT_LE(b, e);
      ASSERT_LE(e, numels[i]);
      for (int64_t j = b; j < e; ++j) {
        EXPECT_EQ(owner[i][static_cast<size_t>(j)], -1) << "param " << i << " element " << j << " owned twice";
        owner[i][static_cast<size_t>(j)] = r;
        EXPECT_EQ(L.owner(L.offsets[i] + j), r);
        const int64_t li = L.local_index(r, L.offsets[i] + j);
        EXPECT_TRUE(0 <= li && li < L.per_rank());
        EXPECT_TRUE(local_seen.insert({r, li}).second) << "rank " << r << " local index " << li << " used twice";
      }
    }
  }
  for (size_t i = 0; i < numels.size(); ++i)
    for (int64_t j = 0; j < numels[i]; ++j)
      EXPECT_NE(owner[i][static_cast<size_t>(j)], -1) << "param " << i << " element " << j;
  const auto L0 = ShardLayout::make(numels, 0, world, {bucket_size, false});
  for (size_t i = 0; i < numels.size(); ++i) {
    bool spans = false;
    for (int64_t j = 0; j < numels[i]; ++j) spans = spans || owner[i][static_cast<size_t>(j)] != owner[i][0];
    EXPECT_EQ(L0.is_split(i), spans) << "param " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardLayoutCover,
                         ::testing::Values(Sizes{{10}, 1, 0}, Sizes{{10}, 3, 0}, Sizes{{7, 1, 9, 4}, 2, 0},
                                           Sizes{{7, 1, 9, 4}, 4, 8}, Sizes{{5, 0, 5}, 4, 0}, Sizes{{3}, 5, 0},
                                           Sizes{{100, 28, 3001, 17}, 3, 500}, Sizes{{4096, 4096, 1}, 8, 0},
                                           Sizes{{4096, 4096, 1}, 8, 1}));

// The model's order decides the buffer (reversed); the index order given only names the params.
TEST(ShardLayout, ModelOrderDecidesTheBuffer) {
  const auto a = ShardLayout::make({10, 20, 30}, 0, 2, {}, {2, 0, 1});   // model order: p2, p0, p1
  // Buffer: p1 at 0, p0 at 64 (20 -> padded to 64), p2 at 128 (74 -> 128).
  EXPECT_EQ(a.offsets, (std::vector<int64_t>{64, 0, 128}));
  EXPECT_EQ(a.total, 256);   // 158 padded to lcm(2, 128)
}

TEST(ShardLayout, RejectsBadGroups) {
  EXPECT_THROW(ShardLayout::make({4}, 0, 0), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4}, -1, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4, 5}, 0, 2, {}, {0, 0}), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({4, 5}, 0, 2, {}, {0}), std::invalid_argument);
  EXPECT_THROW(ShardLayout::make({-1}, 0, 1), std::invalid_argument);
}

}   // namespace
