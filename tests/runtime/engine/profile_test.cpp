// The profile registry and its report without a GPU: engines added with made-up op times, then the
// report's order, ranks, means, shares and per-run line, reset and removal checked.
#include "runtime/engine/profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::engine::profile {
namespace {

struct Row {
  unsigned rank, op;
  std::string opcode, output;
  double total, mean, share;
};

// The op rows of the report, in order.
std::vector<Row> rows_of(const std::string& text) {
  std::vector<Row> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    Row r{};
    char opcode[32], output[64];
    if (std::sscanf(line.c_str(), " %u %u %31s %63s %lf %lf %lf%%", &r.rank, &r.op, opcode, output,
                    &r.total, &r.mean, &r.share) == 7) {
      r.opcode = opcode;
      r.output = output;
      rows.push_back(r);
    }
  }
  return rows;
}

TEST(Profile, ReportSortsOpsByTotalTimeWithSharesOfTheEngine) {
  reset();
  EXPECT_EQ(report(), "") << "no engine ran with profiling on";
  auto record = add_engine("inputs Float32[4], outputs Float32[4]",
                           {{"unary", "Float32[4]"}, {"matmul", "Float32[4,4]"}, {"copy", "-"}});
  EXPECT_EQ(report(), "") << "registered, but no run yet";
  add_run(*record, {1.0f, 6.0f, 1.0f}, 10.0);
  add_run(*record, {1.0f, 10.0f, 1.0f}, 14.0);
  const std::string text = report();
  EXPECT_NE(text.find("(inputs Float32[4], outputs Float32[4]; 3 ops): 2 profiled runs"),
            std::string::npos) << text;
  const std::vector<Row> rows = rows_of(text);
  ASSERT_EQ(rows.size(), 3u) << text;
  EXPECT_EQ(rows[0].rank, 1u);
  EXPECT_EQ(rows[0].op, 1u);
  EXPECT_EQ(rows[0].opcode, "matmul");
  EXPECT_EQ(rows[0].output, "Float32[4,4]");
  EXPECT_DOUBLE_EQ(rows[0].total, 16.0);
  EXPECT_DOUBLE_EQ(rows[0].mean, 8.0);
  EXPECT_NEAR(rows[0].share, 80.0, 0.05);
  // Ties keep op order.
  EXPECT_EQ(rows[1].op, 0u);
  EXPECT_EQ(rows[2].op, 2u);
  EXPECT_EQ(rows[2].rank, 3u);
  EXPECT_NEAR(rows[0].share + rows[1].share + rows[2].share, 100.0, 0.2);
  EXPECT_NE(text.find("  total "), std::string::npos) << text;
  EXPECT_NE(text.find("per run: op time 10.0000 ms (GPU, CUDA events) vs execute wall 12.0000 ms"),
            std::string::npos) << text;
  EXPECT_DOUBLE_EQ(total_ms(), 20.0);

  reset();
  EXPECT_EQ(report(), "");
  EXPECT_DOUBLE_EQ(total_ms(), 0.0);
  add_run(*record, {0.5f, 0.5f, 0.5f}, 2.0);
  EXPECT_EQ(rows_of(report()).size(), 3u);
  remove_engine(record.get());
  EXPECT_EQ(report(), "") << "a destroyed engine leaves the report";
}

TEST(Profile, EnginesAreNumberedAndReportedInOrder) {
  auto a = add_engine("a", {{"fill", "Int32[2]"}});
  auto b = add_engine("b", {{"copy", "Int32[2]"}});
  add_run(*b, {2.0f}, 3.0);
  add_run(*a, {1.0f}, 3.0);
  const std::string text = report();
  const size_t pa = text.find("(a; 1 ops)"), pb = text.find("(b; 1 ops)");
  ASSERT_NE(pa, std::string::npos) << text;
  ASSERT_NE(pb, std::string::npos) << text;
  EXPECT_LT(pa, pb) << text;
  EXPECT_EQ(snapshot().size(), 2u);
  EXPECT_LT(snapshot()[0].id, snapshot()[1].id);
  remove_engine(a.get());
  remove_engine(b.get());
  EXPECT_TRUE(snapshot().empty());
}

TEST(Profile, SwitchIsProcessWide) {
  set_enabled(true);
  EXPECT_TRUE(enabled());
  set_enabled(false);
  EXPECT_FALSE(enabled());
}

}  // namespace
}  // namespace kiln::engine::profile
