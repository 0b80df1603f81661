// The persistent algorithm cache's file: round trip, keys, and every way the file can be unusable
// (it must then be ignored, never trusted or crashed on).
#include "runtime/engine/algo_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kiln::engine {
namespace {

class AlgoCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln_algo_cache_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = std::string(tmpl) + "/nested/dir";  // save() creates what is missing
  }
  void TearDown() override { std::system(("rm -rf " + dir_.substr(0, dir_.find("/nested"))).c_str()); }

  std::string dir_;
  const Hash128 hash_{0x1234, 0xabcd};
};

TEST_F(AlgoCacheTest, RoundTripsEntriesAcrossInstances) {
  AlgoCache first(dir_, "sm90 NVIDIA H200/cudnn 91900", hash_);
  ASSERT_TRUE(first.enabled());
  EXPECT_EQ(first.find(3, "conv"), nullptr);
  first.put(3, "conv", {1, 0, 4096});
  first.put(7, "conv", {6, 2, 0});
  std::string why;
  ASSERT_TRUE(first.save(&why)) << why;
  // The file name keeps only safe characters.
  EXPECT_EQ(first.path().find(' '), std::string::npos);
  EXPECT_EQ(first.path().find("/cudnn"), std::string::npos);

  AlgoCache second(dir_, "sm90 NVIDIA H200/cudnn 91900", hash_);
  const std::vector<int64_t>* e = second.find(3, "conv");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(*e, (std::vector<int64_t>{1, 0, 4096}));
  ASSERT_NE(second.find(7, "conv"), nullptr);
  EXPECT_EQ(second.find(7, "matmul"), nullptr);  // another kind of op at that index: a miss
}

TEST_F(AlgoCacheTest, AnotherDeviceOrBlobMisses) {
  AlgoCache a(dir_, "sm90 H200", hash_);
  a.put(0, "conv", {1, 0, 0});
  ASSERT_TRUE(a.save());
  EXPECT_EQ(AlgoCache(dir_, "sm100 B200", hash_).find(0, "conv"), nullptr);
  EXPECT_EQ(AlgoCache(dir_, "sm90 H200", Hash128{0x1234, 0xabce}).find(0, "conv"), nullptr);
}

TEST_F(AlgoCacheTest, DamagedFilesAreIgnored) {
  AlgoCache a(dir_, "dev", hash_);
  a.put(0, "conv", {1, 0, 0});
  ASSERT_TRUE(a.save());
  std::string header;
  std::getline(std::ifstream(a.path()), header);
  ASSERT_EQ(AlgoCache(dir_, "dev", hash_).find(0, "conv")->size(), 3u);
  const std::string bodies[] = {
      "",                                                   // empty
      "garbage\n",                                          // no header
      "kiln-algo-cache 999 dev x\n0 conv 1 0 0\n",          // another format version
      header + "\n0 conv 1 zero 0\n",                       // a value that is not a number
      header + "\n-4 conv 1\n",                             // a negative op index
      header + "\n0 conv\n",                                // no values
  };
  for (const std::string& body : bodies) {
    std::ofstream(a.path(), std::ios::trunc) << body;
    EXPECT_EQ(AlgoCache(dir_, "dev", hash_).find(0, "conv"), nullptr) << body;
  }
}

TEST_F(AlgoCacheTest, DisabledAndUnwritableDirectoriesCostNothing) {
  AlgoCache off("", "dev", hash_);
  EXPECT_FALSE(off.enabled());
  off.put(0, "conv", {1});
  EXPECT_TRUE(off.save());
  EXPECT_EQ(off.find(0, "conv"), nullptr);

  const std::string file = dir_.substr(0, dir_.find("/nested")) + "/a_file";
  std::ofstream(file) << "x";  // a file where a directory should be
  AlgoCache blocked(file + "/sub", "dev", hash_);
  blocked.put(0, "conv", {1});
  std::string why;
  EXPECT_FALSE(blocked.save(&why));
  EXPECT_NE(why.find("cannot create the directory"), std::string::npos) << why;
  std::remove(file.c_str());
}

TEST_F(AlgoCacheTest, DefaultDirFollowsTheEnvironment) {
  setenv("KILN_CACHE_DIR", "off", 1);
  EXPECT_EQ(AlgoCache::default_dir(), "");
  setenv("KILN_CACHE_DIR", "/somewhere", 1);
  EXPECT_EQ(AlgoCache::default_dir(), "/somewhere");
  unsetenv("KILN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(AlgoCache::default_dir(), "/xdg/kiln");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(AlgoCache::default_dir(), "/home/u/.cache/kiln");
}

}  // namespace
}  // namespace kiln::engine
