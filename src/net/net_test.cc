#include <gtest/gtest.h>

#include <string>

#include "net/base64.h"

namespace dsi::net {
namespace {

TEST(Base64, Rfc4648Vectors) {
    const std::pair<const char*, const char*> cases[] = {
        {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},         {"foo", "Zm9v"},
        {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
    };
    for (const auto& [plain, coded] : cases) {
        EXPECT_EQ(base64_encode(plain), coded);
        auto back = base64_decode(coded);
        ASSERT_TRUE(back.is_ok()) << coded;
        EXPECT_EQ(*back, plain);
    }
}

TEST(Base64, EveryByteRoundTrips) {
    std::string all;
    for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
    for (size_t n = 0; n <= all.size(); n += 37) {
        const std::string part = all.substr(0, n);
        auto back = base64_decode(base64_encode(part));
        ASSERT_TRUE(back.is_ok());
        EXPECT_EQ(*back, part);
    }
}

TEST(Base64, MalformedIsRejected) {
    for (const char* bad : {"Zm9", "Zm9v!A==", "Zg==Zg==", "Z===", "=Zg=", "Zg=v"}) {
        EXPECT_FALSE(base64_decode(bad).is_ok()) << bad;
    }
}

}  // namespace
}  // namespace dsi::net
