// The builder's operand layout table (builder/src/ir.cpp) against the layouts written above each
// opcode in format/blob_format.h, the format's single definition: the two cannot drift.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "builder/src/ir.h"

namespace kiln::builder {
namespace {

// "[t x, n kind(BinaryKind), [rank] sizes, t[num_inputs] inputs]" per opcode number, joined from
// the comment lines that end right above "kName = N,".
std::map<uint32_t, std::string> header_layouts() {
  std::ifstream in(KILN_SOURCE_DIR "/format/blob_format.h");
  EXPECT_TRUE(in.good()) << "cannot open blob_format.h under " << KILN_SOURCE_DIR;
  std::map<uint32_t, std::string> out;
  std::string line, layout;
  bool in_enum = false, in_layout = false;
  while (std::getline(in, line)) {
    if (line.find("enum class Opcode") != std::string::npos) in_enum = true;
    if (!in_enum) continue;
    if (line.find("};") == 0) break;
    size_t c = line.find("// ");
    if (c != std::string::npos) {
      std::string text = line.substr(c + 3);
      if (text.rfind("[", 0) == 0) {
        in_layout = true;
        layout.clear();
      }
      if (in_layout) layout += (layout.empty() ? "" : " ") + text.substr(text.find_first_not_of(' '));
      continue;
    }
    size_t eq = line.find(" = ");
    if (eq != std::string::npos && in_layout) {
      out[uint32_t(std::stoul(line.substr(eq + 3)))] = layout;
      in_layout = false;
    }
  }
  return out;
}

std::string describe(const std::vector<FieldSpec>& specs) {
  std::string s = "[";
  for (size_t i = 0; i < specs.size(); ++i) {
    const FieldSpec& f = specs[i];
    if (i) s += ", ";
    switch (f.kind) {
      case 'l': s += std::string("[") + f.count + "] "; break;
      case 'T': s += std::string("t[") + f.count + "] "; break;
      default: s += std::string(1, f.kind) + " ";
    }
    s += f.name;
  }
  return s + "]";
}

// The header's text without the "(EnumName)" annotations, which the table does not carry.
std::string strip_enums(std::string s) {
  for (size_t open; (open = s.find('(')) != std::string::npos;) s.erase(open, s.find(')', open) - open + 1);
  return s;
}

TEST(Layouts, MatchBlobFormatHeader) {
  auto from_header = header_layouts();
  ASSERT_EQ(from_header.size(), 14u);
  for (const auto& [opcode, text] : from_header) {
    const auto* specs = layout(opcode);
    ASSERT_NE(specs, nullptr) << "opcode " << opcode << " has no layout in the builder";
    EXPECT_EQ(describe(*specs), strip_enums(text)) << "opcode " << opcode;
  }
  EXPECT_EQ(layout(0), nullptr);
  EXPECT_EQ(layout(15), nullptr);
}

}  // namespace
}  // namespace kiln::builder
