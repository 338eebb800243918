#include "hyrec/data_loader/parsers.h"

#include <cmath>

#include "gtest/gtest.h"

namespace hyrec::data_loader {
namespace {

std::string CriteoLine(const std::string& label, const std::vector<std::string>& ints,
                       const std::vector<std::string>& cats) {
  std::string line = label;
  for (const auto& i : ints) line += "\t" + i;
  for (const auto& c : cats) line += "\t" + c;
  return line;
}

std::vector<std::string> Ints() {
  std::vector<std::string> v(13, "1");
  v[0] = "";    // missing
  v[1] = "-5";  // negative -> 0
  v[2] = "100000";
  return v;
}
std::vector<std::string> Cats() {
  std::vector<std::string> v(26, "68fd1e64");
  v[3] = "";  // empty token
  return v;
}

TEST(CriteoParser, ParsesFieldsAndTransformsDense) {
  Sample s;
  ASSERT_TRUE(ParseCriteoLine(CriteoLine("1", Ints(), Cats()), {}, &s).ok());
  EXPECT_EQ(s.label, 1.0f);
  ASSERT_EQ(s.dense.size(), 13u);
  EXPECT_EQ(s.dense[0], 0.0f);
  EXPECT_EQ(s.dense[1], 0.0f);
  EXPECT_NEAR(s.dense[2], std::log1p(100000.0), 1e-5);
  EXPECT_NEAR(s.dense[3], std::log(2.0), 1e-6);
  ASSERT_EQ(s.slot_offsets.size(), 27u);
  EXPECT_EQ(s.ids.size(), 25u);  // Empty token skipped.
  EXPECT_EQ(s.slot_offsets[4] - s.slot_offsets[3], 0u);
  // Same token, different slots: different ids.
  EXPECT_NE(s.ids[s.slot_offsets[0]], s.ids[s.slot_offsets[1]]);
  EXPECT_EQ(s.ids[s.slot_offsets[0]], HashToken(0, "68fd1e64"));
}

TEST(CriteoParser, EmptyTokenCanMapToAMissingId) {
  Sample s;
  CriteoOptions options;
  options.missing_id_for_empty = true;
  ASSERT_TRUE(ParseCriteoLine(CriteoLine("0", Ints(), Cats()), options, &s).ok());
  EXPECT_EQ(s.ids.size(), 26u);
  EXPECT_EQ(s.ids[s.slot_offsets[3]], MissingId(3));
}

TEST(CriteoParser, AcceptsCrlfAndAllEmptyFields) {
  Sample s;
  EXPECT_TRUE(ParseCriteoLine(CriteoLine("1", Ints(), Cats()) + "\r", {}, &s).ok());
  EXPECT_TRUE(
      ParseCriteoLine(CriteoLine("0", std::vector<std::string>(13, ""), std::vector<std::string>(26, "")), {}, &s)
          .ok());
  EXPECT_TRUE(s.ids.empty());
}

TEST(CriteoParser, BadLinesSayWhatAndWhere) {
  Sample s;
  struct Case {
    std::string line;
    std::string message;
  };
  std::vector<std::string> ints = Ints();
  ints[4] = "12a";
  std::vector<std::string> cats = Cats();
  cats[7] = "zz12";
  const std::vector<Case> cases = {
      {CriteoLine("1", Ints(), std::vector<std::string>(25, "ab")), "found 39"},
      {CriteoLine("1", Ints(), Cats()) + "\textra", "more than 40"},
      {CriteoLine("2", Ints(), Cats()), "field 1 (label)"},
      {CriteoLine("", Ints(), Cats()), "field 1 (label)"},
      {CriteoLine("1", ints, Cats()), "field 6 (I5): '12a' is not an integer"},
      {CriteoLine("1", Ints(), cats), "field 22 (C8): 'zz12' is not a hex token"},
      {CriteoLine("1", {"99999999999999999999999", "", "", "", "", "", "", "", "", "", "", "", ""}, Cats()),
       "not an integer"},
      {std::string("\x00\xff\x13garbage", 10), "label"},
      {std::string(70000, 'a'), "exceeds the limit"},
      {"", "label"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseCriteoLine(c.line, {}, &s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
  }
}

TEST(LibsvmParser, KthFeatureIsSlotK) {
  Sample s;
  LibsvmOptions options;
  options.num_slots = 4;
  ASSERT_TRUE(ParseLibsvmLine("+1 7:1 3:0.5 9:1", options, &s).ok());
  EXPECT_EQ(s.label, 1.0f);
  EXPECT_EQ(s.ids.size(), 3u);
  EXPECT_EQ(s.ids[0], HashToken(0, "7"));
  EXPECT_EQ(s.ids[1], HashToken(1, "3"));
  EXPECT_EQ(s.ids[2], HashToken(2, "9"));
  EXPECT_EQ(s.slot_offsets[4], 3u);
  ASSERT_TRUE(ParseLibsvmLine("-1 7:1", options, &s).ok());
  EXPECT_EQ(s.label, 0.0f);
  EXPECT_NE(ParseLibsvmLine("1 1:1 2:1 3:1 4:1 5:1", options, &s).message().find("beyond num_slots"),
            std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 7", options, &s).message().find("not idx:val"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 x:1", options, &s).message().find("bad index or value"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 7:nan", options, &s).message().find("bad index or value"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("0.5 7:1", options, &s).message().find("label"), std::string::npos);
  EXPECT_FALSE(ParseLibsvmLine("   ", options, &s).ok());
}

TEST(LibffmParser, FieldIsSlotAndGroupsMultiHot) {
  Sample s;
  LibsvmOptions options;
  options.num_slots = 3;
  ASSERT_TRUE(ParseLibffmLine("0 2:5:1 0:9:1 2:6:1", options, &s).ok());
  EXPECT_EQ(s.label, 0.0f);
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 1, 1, 3}));
  EXPECT_EQ(s.ids[0], HashToken(0, "9"));
  EXPECT_EQ(s.ids[1], HashToken(2, "5"));
  EXPECT_EQ(s.ids[2], HashToken(2, "6"));
  EXPECT_NE(ParseLibffmLine("1 3:1:1", options, &s).message().find("beyond num_slots"), std::string::npos);
  EXPECT_NE(ParseLibffmLine("1 1:1", options, &s).message().find("field:idx:val"), std::string::npos);
  EXPECT_NE(ParseLibffmLine("1 a:1:1", options, &s).message().find("field 'a'"), std::string::npos);
}

}  // namespace
}  // namespace hyrec::data_loader
