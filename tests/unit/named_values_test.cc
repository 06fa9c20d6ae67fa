// common/named_values.h: one table gives an enum's names both ways and the error listing them.
#include "common/named_values.h"

#include <gtest/gtest.h>

namespace forge {
namespace {

enum class Fruit { kApple, kPear, kFig };

constexpr std::array<NamedValue<Fruit>, 3> kFruitNames{{{"apple", Fruit::kApple},
                                                         {"pear", Fruit::kPear},
                                                         {"poire", Fruit::kPear}}};

TEST(NamedValuesTest, NamesBothWays) {
  EXPECT_STREQ(NameOf(kFruitNames, Fruit::kApple), "apple");
  // An alias parses; the first name is the one printed.
  EXPECT_EQ(*ValueOf(kFruitNames, "poire", "--fruit"), Fruit::kPear);
  EXPECT_STREQ(NameOf(kFruitNames, Fruit::kPear), "pear");
  // A value the table lacks.
  EXPECT_STREQ(NameOf(kFruitNames, Fruit::kFig), "?");
  EXPECT_EQ(FindName(kFruitNames, Fruit::kFig), nullptr);
}

TEST(NamedValuesTest, UnknownNameListsTheKnownOnes) {
  const StatusOr<Fruit> f = ValueOf(kFruitNames, "kiwi", "--fruit");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(), "--fruit: must be one of apple|pear|poire, got kiwi");
  Fruit out = Fruit::kFig;
  EXPECT_FALSE(ValueOf(kFruitNames, "Apple", "--fruit", &out).ok());  // names are exact
  EXPECT_EQ(out, Fruit::kFig);
  EXPECT_TRUE(ValueOf(kFruitNames, "apple", "--fruit", &out).ok());
  EXPECT_EQ(out, Fruit::kApple);
}

}  // namespace
}  // namespace forge
