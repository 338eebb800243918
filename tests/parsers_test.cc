#include "hyrec/data_loader/parsers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "gtest/gtest.h"
#include "hyrec/data_loader/sample.h"

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

TEST(LibsvmParser, TheLineIsOneMultiHotFeatureWeightedByItsValues) {
  Sample s;
  LibsvmOptions options;
  ASSERT_TRUE(ParseLibsvmLine("+1 7:1 3:0.5 9:2.25", options, &s).ok());
  EXPECT_EQ(s.label, 1.0f);
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "7"), HashToken(0, "3"), HashToken(0, "9")}));
  EXPECT_EQ(s.weights, (std::vector<float>{1.0f, 0.5f, 2.25f}));
  // The same index gives the same id wherever it is on the line: an omitted feature shifts nothing.
  ASSERT_TRUE(ParseLibsvmLine("0 9:1", options, &s).ok());
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "9")}));
  options.use_values = false;
  ASSERT_TRUE(ParseLibsvmLine("-1 7:3", options, &s).ok());
  EXPECT_EQ(s.label, 0.0f);
  EXPECT_TRUE(s.weights.empty());
  EXPECT_NE(ParseLibsvmLine("1 7", options, &s).message().find("not idx:val"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 x:1", options, &s).message().find("bad index or value"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 7:nan", options, &s).message().find("bad index or value"), std::string::npos);
  EXPECT_NE(ParseLibsvmLine("0.5 7:1", options, &s).message().find("label"), std::string::npos);
  EXPECT_FALSE(ParseLibsvmLine("   ", options, &s).ok());
}

TEST(LibsvmParser, IndexRangesMapIndicesToFeatures) {
  Sample s;
  LibsvmOptions options;
  options.index_ranges = {{1, 13}, {14, 100}, {500, 500}};
  ASSERT_TRUE(options.Validate(false).ok());
  ASSERT_TRUE(ParseLibsvmLine("1 20:1 2:38 500:1 14:0.5", options, &s).ok());
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 1, 3, 4}));
  EXPECT_EQ(s.ids,
            (std::vector<uint64_t>{HashToken(0, "2"), HashToken(1, "20"), HashToken(1, "14"), HashToken(2, "500")}));
  EXPECT_EQ(s.weights, (std::vector<float>{38.0f, 1.0f, 0.5f, 1.0f}));
  EXPECT_NE(ParseLibsvmLine("1 200:1", options, &s).message().find("index 200 is in none of the index_ranges"),
            std::string::npos);
  EXPECT_NE(ParseLibsvmLine("1 0:1", options, &s).message().find("index 0"), std::string::npos);
  options.index_ranges = {{1, 13}, {13, 20}};
  EXPECT_NE(options.Validate(false).message().find("not after the previous range's end 13"), std::string::npos);
  options.index_ranges = {{5, 1}};
  EXPECT_NE(options.Validate(false).message().find("ends before it starts"), std::string::npos);
}

// libFM data with one field per position (source.fields): the k-th idx:val is feature k, hashed
// with its slot, whatever its index; a line with another number of them is bad.
TEST(LibsvmParser, FieldsMakeEachPositionAFeature) {
  Sample s;
  LibsvmOptions options;
  options.positional_fields = 3;
  ASSERT_TRUE(options.Validate(false).ok());
  EXPECT_EQ(options.LibsvmSlots(), 3);
  ASSERT_TRUE(ParseLibsvmLine("1 7:1 120:0.5 7:1", options, &s).ok());
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "7"), HashToken(1, "120"), HashToken(2, "7")}));
  EXPECT_EQ(s.weights, (std::vector<float>{1.0f, 0.5f, 1.0f}));
  EXPECT_NE(ParseLibsvmLine("0 7:1 8:1", options, &s).message().find("2 idx:val tokens; fields: 3 needs one per field"),
            std::string::npos);
  EXPECT_NE(ParseLibsvmLine("0 1:1 2:1 3:1 4:1", options, &s).message().find("token 5: more than fields: 3"),
            std::string::npos);
  options.index_ranges = {{1, 2}};
  EXPECT_NE(options.Validate(false).message().find("fields and index_ranges"), std::string::npos);
  options.index_ranges.clear();
  EXPECT_NE(options.Validate(true).message().find("fields is for libsvm"), std::string::npos);
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
  EXPECT_EQ(s.weights, (std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_NE(ParseLibffmLine("1 3:1:1", options, &s).message().find("field 3 is outside the fields 0..2"),
            std::string::npos);
  options.field_base = 1;  // Fields numbered from 1.
  ASSERT_TRUE(ParseLibffmLine("1 3:1:0.5 1:2:1", options, &s).ok());
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 1, 1, 2}));
  EXPECT_EQ(s.weights, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_NE(ParseLibffmLine("1 0:1:1", options, &s).message().find("(num_slots 3, field_base 1)"), std::string::npos);
  options.field_base = 0;
  EXPECT_NE(ParseLibffmLine("1 1:1", options, &s).message().find("field:idx:val"), std::string::npos);
  EXPECT_NE(ParseLibffmLine("1 a:1:1", options, &s).message().find("field 'a'"), std::string::npos);
}

CsvColumn Column(const std::string& name, CsvColumn::Kind kind) {
  CsvColumn c;
  c.name = name;
  c.kind = kind;
  return c;
}

// click,price,site,tags,wtags,note: every kind of column, resolved against a header.
CsvOptions ClickLog() {
  CsvOptions o;
  CsvColumn label = Column("click", CsvColumn::Kind::kLabel);
  label.positives = {"1", "yes"};
  label.negatives = {"0", "no"};
  CsvColumn price = Column("price", CsvColumn::Kind::kDense);
  price.transform = CsvColumn::Transform::kLog1p;
  CsvColumn age = Column("age", CsvColumn::Kind::kDense);
  age.transform = CsvColumn::Transform::kStandardize;
  age.mean = 30;
  age.stddev = 10;
  CsvColumn wtags = Column("wtags", CsvColumn::Kind::kWeighted);
  wtags.separator = ';';
  o.columns = {label,
               price,
               age,
               Column("site", CsvColumn::Kind::kCategorical),
               Column("tags", CsvColumn::Kind::kMulti),
               wtags,
               Column("note", CsvColumn::Kind::kIgnore)};
  return o;
}

// Header-less options with a column of each kind at the given positions.
CsvOptions Positional(const std::vector<std::pair<int, CsvColumn::Kind>>& columns) {
  CsvOptions o;
  o.header = false;
  for (const auto& [index, kind] : columns) {
    CsvColumn c;
    c.index = index;
    c.kind = kind;
    o.columns.push_back(c);
  }
  return o;
}

const std::vector<std::string> kHeader = {"site", "click", "price", "tags", "age", "wtags", "note"};

// A sparse column declared by position is named c<index> unless it names its feature; so may a
// named one. Only sparse columns have features.
TEST(CsvParser, SparseColumnsMayNameTheirFeatures) {
  CsvOptions o = Positional({{0, CsvColumn::Kind::kLabel},
                             {1, CsvColumn::Kind::kCategorical},
                             {2, CsvColumn::Kind::kCategorical},
                             {3, CsvColumn::Kind::kDense}});
  o.columns[2].feature = "user_id";
  ASSERT_TRUE(o.Resolve(nullptr).ok());
  EXPECT_EQ(o.SlotNames(), (std::vector<std::string>{"c1", "user_id"}));
  Sample s;
  EXPECT_EQ(ParseCsvLine("1,a,b,x", o, &s).message(), "the column at index 3: 'x' is not a finite number")
      << "0-based, as declared";
  o.columns[3].feature = "age";
  EXPECT_EQ(o.Validate().message(),
            "csv.columns[3]: feature names a sparse (categorical, multi or weighted) column's feature");
}

TEST(CsvParser, DeclaredColumnsByNameGiveLabelDenseAndEverySparseKind) {
  CsvOptions o = ClickLog();
  ASSERT_TRUE(o.Resolve(&kHeader).ok());
  EXPECT_EQ(o.num_dense(), 2);
  EXPECT_EQ(o.num_slots(), 3);
  EXPECT_EQ(o.SlotNames(), (std::vector<std::string>{"site", "tags", "wtags"}));
  Sample s;
  ASSERT_TRUE(ParseCsvLine("a.com,yes,9,x|y||z,40,u:0.5;v:2,\"free, text\"", o, &s).ok());
  EXPECT_EQ(s.label, 1.0f);
  ASSERT_EQ(s.dense.size(), 2u);
  EXPECT_FLOAT_EQ(s.dense[0], std::log1p(9.0f));
  EXPECT_FLOAT_EQ(s.dense[1], 1.0f);
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 1, 4, 6}));
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "a.com"), HashToken(1, "x"), HashToken(1, "y"),
                                          HashToken(1, "z"), HashToken(2, "u"), HashToken(2, "v")}));
  EXPECT_EQ(s.weights, (std::vector<float>{1, 1, 1, 1, 0.5f, 2}));  // Weighted: every id has a weight.
  // Empty values: no id, a dense 0; a negative price is log1p(0).
  ASSERT_TRUE(ParseCsvLine(",no,-3,,,,", o, &s).ok());
  EXPECT_EQ(s.label, 0.0f);
  EXPECT_EQ(s.dense, (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(s.slot_offsets, (std::vector<uint32_t>{0, 0, 0, 0}));
}

// Dense values take a fast path for plain decimals; it must give what the general parser gives.
TEST(CsvParser, DenseValuesEqualTheGeneralParsersForEveryTransform) {
  for (const auto transform : {CsvColumn::Transform::kNone, CsvColumn::Transform::kLog1p}) {
    CsvOptions o = Positional({{0, CsvColumn::Kind::kLabel}, {1, CsvColumn::Kind::kDense}});
    o.columns[1].transform = transform;
    ASSERT_TRUE(o.Resolve(nullptr).ok());
    for (const std::string v : {"0", "-0", "7", "-7", "16383", "16384", "123456789012345", "1234567890123456", "0.1",
                                "3.25", "-2.5e3", "1e-5", "1.", ".5", "0.30000000000000004", "99999.999999"}) {
      Sample s;
      ASSERT_TRUE(ParseCsvLine("1," + v, o, &s).ok()) << v;
      double expected = 0;
      ASSERT_TRUE(absl::SimpleAtod(v, &expected)) << v;
      if (transform == CsvColumn::Transform::kLog1p) expected = std::log1p(std::max(expected, 0.0));
      EXPECT_EQ(s.dense[0], static_cast<float>(expected)) << v;
    }
    Sample s;
    EXPECT_FALSE(ParseCsvLine("1,-", o, &s).ok());
    EXPECT_FALSE(ParseCsvLine("1,1.2.3", o, &s).ok());
    EXPECT_FALSE(ParseCsvLine("1,nan", o, &s).ok());
  }
}

TEST(CsvParser, QuotingFollowsRfc4180) {
  CsvOptions o = Positional({{0, CsvColumn::Kind::kLabel}, {1, CsvColumn::Kind::kCategorical}});
  ASSERT_TRUE(o.Resolve(nullptr).ok());
  Sample s;
  ASSERT_TRUE(ParseCsvLine("1,\"say \"\"hi\"\", then\"\r", o, &s).ok());
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "say \"hi\", then")}));
  ASSERT_TRUE(ParseCsvLine("\"0\",\"\"", o, &s).ok());  // A quoted empty field.
  EXPECT_EQ(s.label, 0.0f);
  EXPECT_TRUE(s.ids.empty());
  EXPECT_NE(ParseCsvLine("1,\"open", o, &s).message().find("never closed"), std::string::npos);
  EXPECT_NE(ParseCsvLine("1,\"a\"b", o, &s).message().find("follows its closing quote"), std::string::npos);
  // Another delimiter, no quoting: quotes are data.
  o.delimiter = '\t';
  o.quote = '\0';
  ASSERT_TRUE(ParseCsvLine("1\t\"q\"", o, &s).ok());
  EXPECT_EQ(s.ids, (std::vector<uint64_t>{HashToken(0, "\"q\"")}));
}

TEST(CsvParser, BadRowsNameTheFieldAndColumn) {
  CsvOptions o = ClickLog();
  ASSERT_TRUE(o.Resolve(&kHeader).ok());
  Sample s;
  auto message = [&](const std::string& line) { return std::string(ParseCsvLine(line, o, &s).message()); };
  EXPECT_NE(message("a,maybe,1,,1,,").find("field 2 ('click'): 'maybe' is neither a positive (1, yes)"),
            std::string::npos);
  EXPECT_NE(message("a,1,cheap,,1,,").find("field 3 ('price'): 'cheap' is not a finite number"), std::string::npos);
  EXPECT_NE(message("a,1,inf,,1,,").find("not a finite number"), std::string::npos);
  EXPECT_NE(message("a,1,1,,1,u;v:1,").find("field 6 ('wtags'): 'u' is not id:weight"), std::string::npos);
  EXPECT_NE(message("a,1,1,,1,,,extra").find("found 8 fields, expected 7 (the header's)"), std::string::npos);
  EXPECT_NE(message("a,1").find("found 2 fields"), std::string::npos);
  CsvOptions unresolved = ClickLog();
  EXPECT_FALSE(ParseCsvLine("a,1,1,,1,,", unresolved, &s).ok());
}

// A time column gives the sample's time in whole seconds; empty is 0; anything else is a bad line
// naming the column; two time columns are refused.
TEST(CsvParser, ATimeColumnGivesTheSampleTime) {
  CsvOptions o = Positional({{0, CsvColumn::Kind::kTime}, {1, CsvColumn::Kind::kLabel}, {2, CsvColumn::Kind::kDense}});
  ASSERT_TRUE(o.Resolve(nullptr).ok());
  Sample s;
  ASSERT_TRUE(ParseCsvLine("1700000000,1,2", o, &s).ok());
  EXPECT_EQ(s.time, 1700000000u);
  ASSERT_TRUE(ParseCsvLine(",0,2", o, &s).ok());
  EXPECT_EQ(s.time, 0u);
  for (const std::string bad : {"-5", "1.5", "soon", "99999999999999999999"}) {
    EXPECT_NE(ParseCsvLine(bad + ",1,2", o, &s).message().find("is not a time in whole seconds"), std::string::npos)
        << bad;
  }
  // A time more than a day after the clock is a bad line: raised to it, a ttl table would expire
  // every row it holds. A day ahead (clocks differ) is a time.
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now()));
  ASSERT_TRUE(ParseCsvLine(absl::StrCat(now + 86000, ",1,2"), o, &s).ok());
  for (const uint64_t ahead : {now + 2 * 86400, uint64_t{1} << 62}) {
    const absl::Status far = ParseCsvLine(absl::StrCat(ahead, ",1,2"), o, &s);
    EXPECT_NE(far.message().find("s after this machine's clock"), std::string::npos) << far;
    EXPECT_NE(far.message().find("the column at index 0"), std::string::npos) << far;
  }
  CsvOptions two = Positional({{0, CsvColumn::Kind::kTime}, {1, CsvColumn::Kind::kLabel}, {2, CsvColumn::Kind::kTime}});
  EXPECT_NE(two.Validate().message().find("at most one column may be the time"), std::string::npos);
}

// A tab-separated file read with the default comma: the header is one field, and the error says
// which delimiter would split it, not only that a column is missing.
TEST(CsvParser, AHeaderOfOneFieldNamesTheLikelyDelimiter) {
  CsvOptions o = ClickLog();
  const std::vector<std::string> one = {"site\tclick\tprice\tage\ttags\twtags\tnote"};
  const std::string m(o.Resolve(&one).message());
  EXPECT_NE(m.find("is not in the header"), std::string::npos) << m;
  EXPECT_NE(m.find("the header parsed as one field with the delimiter ','"), std::string::npos) << m;
  EXPECT_NE(m.find("'\\t' splits it into 7 fields: csv.delimiter is probably \"\\t\""), std::string::npos) << m;
  // A header of one field that no other delimiter splits gets no hint.
  o = ClickLog();
  const std::vector<std::string> word = {"site"};
  EXPECT_EQ(std::string(o.Resolve(&word).message()).find("probably"), std::string::npos);
}

TEST(CsvParser, DeclarationsAreCheckedAgainstTheHeader) {
  CsvOptions o = ClickLog();
  std::vector<std::string> lacking = {"site", "click", "price", "tags", "wtags", "note"};
  EXPECT_NE(o.Resolve(&lacking).message().find("csv column 'age' is not in the header (site, click"),
            std::string::npos);
  o = ClickLog();
  std::vector<std::string> more = kHeader;
  more.push_back("extra");
  EXPECT_NE(o.Resolve(&more).message().find("csv field 8 ('extra') is not declared"), std::string::npos);
  o = ClickLog();
  o.ignore_undeclared = true;
  ASSERT_TRUE(o.Resolve(&more).ok());
  Sample s;
  EXPECT_TRUE(ParseCsvLine("a,1,1,,1,,,whatever", o, &s).ok());
  // Declarations that cannot work.
  o = ClickLog();
  o.columns[1].kind = CsvColumn::Kind::kLabel;
  EXPECT_NE(o.Validate().message().find("exactly one column must be the label (2 are)"), std::string::npos);
  o = ClickLog();
  o.header = false;
  EXPECT_NE(o.Validate().message().find("named 'click' but csv.header is false"), std::string::npos);
  o = ClickLog();
  o.columns[2].stddev = 0;
  EXPECT_NE(o.Validate().message().find("stddev > 0"), std::string::npos);
  o = ClickLog();
  o.columns[0].negatives = {"1"};
  EXPECT_NE(o.Validate().message().find("'1' is both a positive and a negative"), std::string::npos);
  o = ClickLog();
  o.columns[3].name = "tags";
  EXPECT_NE(o.Validate().message().find("'tags' is declared twice"), std::string::npos);
  // Positions without a header: every position up to the last declared must be declared.
  CsvOptions p = Positional({{0, CsvColumn::Kind::kLabel}, {2, CsvColumn::Kind::kCategorical}});
  EXPECT_NE(p.Resolve(nullptr).message().find("csv field 2 is not declared"), std::string::npos);
}

// Data to score may lack its label (label_optional): the same features as with one, a NaN
// label. Without the option such a line is a bad line, as before.
TEST(LabelOptional, EveryFormatReadsALineWithoutItsLabel) {
  Sample with, without;
  CriteoOptions criteo;
  ASSERT_TRUE(ParseCriteoLine(CriteoLine("1", Ints(), Cats()), criteo, &with).ok());
  const std::string criteo_line = CriteoLine("1", Ints(), Cats());
  const std::string no_label = criteo_line.substr(criteo_line.find('\t') + 1);
  EXPECT_NE(ParseCriteoLine(no_label, criteo, &without).message().find("field 1 (label)"), std::string::npos);
  criteo.label_optional = true;
  ASSERT_TRUE(ParseCriteoLine(no_label, criteo, &without).ok());
  EXPECT_TRUE(std::isnan(without.label));
  EXPECT_EQ(without.dense, with.dense);
  EXPECT_EQ(without.ids, with.ids);
  ASSERT_TRUE(ParseCriteoLine(criteo_line, criteo, &without).ok());  // A label is still read.
  EXPECT_EQ(without.label, 1.0f);

  LibsvmOptions libsvm;
  libsvm.positional_fields = 2;
  ASSERT_TRUE(ParseLibsvmLine("1 7:1 9:0.5", libsvm, &with).ok());
  EXPECT_NE(ParseLibsvmLine("7:1 9:0.5", libsvm, &without).message().find("token 1 (label)"), std::string::npos);
  libsvm.label_optional = true;
  ASSERT_TRUE(ParseLibsvmLine("7:1 9:0.5", libsvm, &without).ok());
  EXPECT_TRUE(std::isnan(without.label));
  EXPECT_EQ(without.ids, with.ids);
  EXPECT_EQ(without.weights, with.weights);
  EXPECT_NE(ParseLibsvmLine("7:1 x", libsvm, &without).message().find("token 2: 'x'"), std::string::npos)
      << "the line's own token numbers";
  ASSERT_TRUE(ParseLibffmLine("0:7:1 1:9:1", libsvm, &without).ok());
  EXPECT_TRUE(std::isnan(without.label));

  CsvOptions csv = ClickLog();
  csv.label_optional = true;
  std::vector<std::string> header = {"site", "price", "tags", "age", "wtags", "note"};
  ASSERT_TRUE(csv.Resolve(&header).ok());
  ASSERT_TRUE(ParseCsvLine("a,1,x|y,30,,n", csv, &without).ok());
  EXPECT_TRUE(std::isnan(without.label));
  EXPECT_EQ(without.ids.size(), 3u);
  csv = ClickLog();
  csv.label_optional = true;
  ASSERT_TRUE(csv.Resolve(&kHeader).ok());  // With the label's column, it is read.
  ASSERT_TRUE(ParseCsvLine("a,yes,1,x|y,30,,n", csv, &without).ok());
  EXPECT_EQ(without.label, 1.0f);
  csv = ClickLog();
  EXPECT_NE(csv.Resolve(&header).message().find("csv column 'click' is not in the header"), std::string::npos);
}

// Kept columns are placed by the header's names, or without one by c<index>.
TEST(CsvParser, KeptColumnsArePlacedByNameOrPosition) {
  CsvOptions o = ClickLog();
  o.keep = {"note", "site"};
  ASSERT_TRUE(o.Resolve(&kHeader).ok());
  EXPECT_EQ(o.keep_index, (std::vector<int>{6, 0}));
  o = ClickLog();
  o.keep = {"nope"};
  EXPECT_NE(o.Resolve(&kHeader).message().find("kept column 'nope' is not in the header"), std::string::npos);
  CsvOptions p = Positional({{0, CsvColumn::Kind::kLabel}, {1, CsvColumn::Kind::kCategorical}});
  p.keep = {"c1"};
  ASSERT_TRUE(p.Resolve(nullptr).ok());
  EXPECT_EQ(p.keep_index, (std::vector<int>{1}));
  p = Positional({{0, CsvColumn::Kind::kLabel}, {1, CsvColumn::Kind::kCategorical}});
  p.keep = {"c2"};
  EXPECT_NE(p.Resolve(nullptr).message().find("kept column 'c2' is not a field"), std::string::npos);
}

TEST(Formats, EveryFormatHasTheNameItsConfigKeyTakes) {
  EXPECT_EQ(FormatName(Format::kCriteo), "criteo");
  EXPECT_EQ(FormatName(Format::kLibsvm), "libsvm");
  EXPECT_EQ(FormatName(Format::kLibffm), "libffm");
  EXPECT_EQ(FormatName(Format::kCsv), "csv");
  EXPECT_EQ(FormatName(Format::kSynthetic), "synthetic");
}

}  // namespace
}  // namespace hyrec::data_loader
