#include "tokenizer/internal/unicode.h"

#include <gtest/gtest.h>

#include "tokenizer/internal/bpe.h"

namespace dsi::tokenizer_internal {
namespace {

TEST(UnicodeTest, SpaceIsOnigurumaSpace) {
    // Oniguruma doc/RE, Unicode \s: 0009-000D, 0085, Zs, Zl, Zp.
    std::vector<uint32_t> spaces = {0x09, 0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,
                                    0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
    for (uint32_t cp = 0x2000; cp <= 0x200A; ++cp) spaces.push_back(cp);
    int count = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp_class(cp) & kSpace) {
            ++count;
            EXPECT_NE(std::find(spaces.begin(), spaces.end(), cp), spaces.end()) << cp;
        }
    }
    EXPECT_EQ(count, 25);
    EXPECT_FALSE(cp_class(0xFEFF) & kSpace);  // JavaScript's \s has it; Oniguruma's not
    EXPECT_FALSE(cp_class(0x200B) & kSpace);
}

TEST(UnicodeTest, Categories) {
    EXPECT_EQ(cp_class('a') & (kL | kAsciiAlpha), kL | kAsciiAlpha);
    EXPECT_TRUE(cp_class(0x4E00) & kL);
    EXPECT_TRUE(cp_class(0x4E00) & kCjk);
    EXPECT_FALSE(cp_class(0x9FA6) & kCjk);
    EXPECT_TRUE(cp_class(0x0301) & kM);
    EXPECT_TRUE(cp_class('7') & kN);
    EXPECT_TRUE(cp_class(0x2167) & kN);  // Roman numeral eight, Nl
    EXPECT_TRUE(cp_class(0x00B2) & kN);  // superscript two, No
    EXPECT_TRUE(cp_class(',') & kP);
    EXPECT_TRUE(cp_class('+') & kS);
    EXPECT_TRUE(cp_class('$') & kS);
    EXPECT_TRUE(cp_class(0x1F600) & kS);
    EXPECT_TRUE(cp_class('~') & kAsciiPunct);
    EXPECT_FALSE(cp_class(0x200D) & (kL | kM | kN | kP | kS | kSpace));
    EXPECT_EQ(cp_class(0x110000), 0);
}

TEST(UnicodeTest, AsciiTableMatchesIcuTable) {
    for (uint32_t c = 0; c < 128; ++c) EXPECT_EQ(kAsciiClasses.v[c], cp_class(c)) << c;
}

TEST(UnicodeTest, Utf8Steps) {
    EXPECT_EQ(utf8_step("a").kind, Utf8Step::kValid);
    EXPECT_EQ(utf8_step("\xE4\xB8\x96").len, 3u);
    EXPECT_EQ(utf8_step("\xE4\xB8").kind, Utf8Step::kIncomplete);
    EXPECT_EQ(utf8_step("\xE4\x41").kind, Utf8Step::kInvalid);
    EXPECT_EQ(utf8_step("\xE4\x41").len, 1u);
    EXPECT_EQ(utf8_step("\xF0\x9F\x98\x41").len, 3u);  // maximal subpart F0 9F 98
    EXPECT_EQ(utf8_step("\xC0\x80").len, 1u);          // overlong lead
    EXPECT_EQ(utf8_step("\xE0\x80\x80").len, 1u);      // overlong 3-byte
    EXPECT_EQ(utf8_step("\xED\xA0\x80").len, 1u);      // surrogate
    EXPECT_EQ(valid_utf8_prefix("abc\xE4\xB8\x96\xFF"), 6u);
    EXPECT_EQ(utf8_lossy("ok"), "ok");
}

TEST(UnicodeTest, ByteLevelAlphabet) {
    EXPECT_EQ(byte_to_char('A'), uint32_t('A'));
    EXPECT_EQ(byte_to_char(' '), 0x120u);   // 'Ġ'
    EXPECT_EQ(byte_to_char('\n'), 0x10Au);  // 'Ċ'
    for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_of_char(byte_to_char(uint8_t(b))), b);
    EXPECT_EQ(byte_of_char(0x4E00), -1);
    EXPECT_EQ(byte_level_encode(" hi"), "Ġhi");
}

}  // namespace
}  // namespace dsi::tokenizer_internal
