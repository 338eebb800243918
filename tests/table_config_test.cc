#include "hyrec/embedding_ps/table_config.h"

#include "gtest/gtest.h"
#include "hyrec/common/yaml_config.h"

namespace hyrec::embedding_ps {
namespace {

TEST(TableConfig, ParsesCompactSpecs) {
  auto tables = ParseTableSpecs("user:16:adagrad:0.05, item:32:adam ,bias:1,ads:8:adagrad_rowwise:0.1:fp16");
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 4u);
  EXPECT_EQ((*tables)[3].optimizer.kind, OptimizerKind::kAdagradRowwise);
  EXPECT_EQ((*tables)[3].precision, RowPrecision::kFp16);
  EXPECT_EQ((*tables)[0].precision, RowPrecision::kFp32);
  EXPECT_EQ((*tables)[0].name, "user");
  EXPECT_EQ((*tables)[0].dim, 16);
  EXPECT_FLOAT_EQ((*tables)[0].optimizer.learning_rate, 0.05f);
  EXPECT_EQ((*tables)[1].optimizer.kind, OptimizerKind::kAdam);
  EXPECT_EQ((*tables)[2].optimizer.kind, OptimizerKind::kAdagrad);
  EXPECT_EQ((*tables)[2].seed, 2u);
}

TEST(TableConfig, CompactSpecErrorsNameTheSpec) {
  EXPECT_NE(ParseTableSpecs("a:16,a:8").status().message().find("defined twice"), std::string::npos);
  EXPECT_NE(ParseTableSpecs("a").status().message().find("expected name:dim"), std::string::npos);
  EXPECT_NE(ParseTableSpecs("a:16:sgd:fast").status().message().find("'fast' is not a number"), std::string::npos);
  EXPECT_NE(ParseTableSpecs("a:0").status().message().find("dim must be in"), std::string::npos);
  const absl::Status precision = ParseTableSpecs("a:16:sgd:0.1:fp8").status();
  EXPECT_NE(precision.message().find("table spec 'a:16:sgd:0.1:fp8'"), std::string::npos) << precision;
  EXPECT_NE(precision.message().find("fp8"), std::string::npos) << precision;
  EXPECT_NE(ParseTableSpecs("a:16:sgd:0.1:fp16:x").status().message().find("expected name:dim"), std::string::npos);
  EXPECT_EQ(ParseTableSpecs("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TableConfig, ParsesYamlStrictly) {
  auto root = ParseYaml(
      "- name: a\n  dim: 4\n  optimizer: {kind: ftrl, learning_rate: 0.1, ftrl_l1: 0.5}\n"
      "  admission: {probability: 0.5, min_count: 3}\n"
      "- name: b\n  dim: 2\n  initializer: {kind: normal, stddev: 0.2}\n",
      "t.yaml");
  ASSERT_TRUE(root.ok());
  auto tables = ParseTableConfigs(*root, "tables");
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_EQ((*tables)[0].optimizer.kind, OptimizerKind::kFtrl);
  EXPECT_FLOAT_EQ((*tables)[0].optimizer.ftrl_l1, 0.5f);
  EXPECT_EQ((*tables)[0].admission.min_count, 3u);
  EXPECT_EQ((*tables)[1].initializer.kind, InitializerKind::kNormal);

  auto bad = ParseYaml("- name: a\n  dim: 4\n  optimizer: {kind: adagrd}\n", "t.yaml");
  auto result = ParseTableConfigs(*bad, "tables");
  EXPECT_NE(result.status().message().find("tables[0].optimizer.kind"), std::string::npos) << result.status();
  bad = ParseYaml("- name: a\n  dim: 4\n  admission: {probability: 2}\n", "t.yaml");
  result = ParseTableConfigs(*bad, "tables");
  EXPECT_NE(result.status().message().find("admission.probability"), std::string::npos) << result.status();
  bad = ParseYaml("- name: a\n  dim: -3\n", "t.yaml");
  result = ParseTableConfigs(*bad, "tables");
  EXPECT_NE(result.status().message().find("tables[0] (line 1)"), std::string::npos) << result.status();
}

}  // namespace
}  // namespace hyrec::embedding_ps
