// CompileServer + RemoteCompiler over real loopback sockets (ephemeral ports): a
// remote compile equals a local one byte for byte, errors keep their code and
// message, and every failure mode (server down, oversized request, other tokenizer,
// busy) is a clear error without a hang. Every wait is bounded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "grammar/compile_server.h"
#include "grammar/internal/compile_wire.h"
#include "grammar/remote_compiler.h"

namespace dsi::grammar {
namespace {

constexpr int64_t kWaitNs = int64_t{20} * 1000 * 1000 * 1000;

std::shared_ptr<const Vocabulary> byte_vocab(int extra = 0) {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    for (int i = 0; i < extra; ++i) toks.push_back("ab" + std::to_string(i));
    toks.push_back("");
    return Vocabulary::from_tokens(std::move(toks), {static_cast<int32_t>(toks.size() - 1)});
}

std::unique_ptr<CompileServer> start_server(std::shared_ptr<const Vocabulary> vocab,
                                            CompileServerOptions o = {}) {
    auto s = CompileServer::start(std::move(o), std::move(vocab));
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return std::move(s).value();
}

std::unique_ptr<RemoteCompiler> client(const std::string& address, std::shared_ptr<const Vocabulary> vocab) {
    RemoteCompilerOptions o;
    o.address = address;
    o.io_timeout_ms = 20000;
    auto c = RemoteCompiler::create(o, std::move(vocab));
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return std::move(c).value();
}

const GrammarSpec kSpecs[] = {
    {GrammarKind::kJsonSchema,
     R"({"type":"object","properties":{"a":{"type":"integer","minimum":3}},"required":["a"]})"},
    {GrammarKind::kJsonObject, ""},
    {GrammarKind::kRegex, "[a-c]{2,4}x"},
    {GrammarKind::kEbnf, "root ::= \"yes\" | \"no\""},
};

TEST(CompileServer, RoundTripEqualsLocalCompile) {
    auto vocab = byte_vocab();
    auto server = start_server(vocab);
    auto remote = client(server->address(), vocab);
    for (const auto& spec : kSpecs) {
        auto local = compile_grammar(spec);
        ASSERT_TRUE(local.is_ok()) << local.status().to_string();
        auto bytes = remote->compile_serialized(spec);
        ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
        EXPECT_EQ(*bytes, local->serialize()) << grammar_kind_name(spec.kind);
        // Through the CompileService interface: a usable CompiledGrammar.
        auto h = remote->submit(spec, vocab);
        ASSERT_TRUE(h.is_ok()) << h.status().to_string();
        CompileResult r = (*h)->wait_for(kWaitNs);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        EXPECT_EQ((*r)->grammar().serialize(), local->serialize());
    }
    GrammarMatcher m(*remote->submit(kSpecs[0], vocab).value()->wait_for(kWaitNs));
    EXPECT_TRUE(m.advance_bytes("{\"a\":3}") && m.is_accepted());
    // The spec's JSON options travel (issue 21).
    GrammarSpec flexible = kSpecs[0];
    flexible.flexible_whitespace = flexible.any_property_order = true;
    auto local = compile_grammar(flexible);
    ASSERT_TRUE(local.is_ok());
    auto bytes = remote->compile_serialized(flexible);
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
    EXPECT_EQ(*bytes, local->serialize());
    EXPECT_NE(*bytes, compile_grammar(kSpecs[0])->serialize());
}

TEST(CompileServer, ErrorsKeepCodeAndMessage) {
    auto vocab = byte_vocab();
    auto server = start_server(vocab);
    auto remote = client(server->address(), vocab);
    const GrammarSpec bad[] = {
        {GrammarKind::kJsonSchema, R"({"type":"array","contains":{}})"},  // UNIMPLEMENTED
        {GrammarKind::kJsonSchema, R"({"type":"strnig"})"},               // INVALID_ARGUMENT
        {GrammarKind::kRegex, "(a)\\1"},
        {GrammarKind::kEbnf, "root ::= missing"},
    };
    for (const auto& spec : bad) {
        auto local = compile_grammar(spec);
        ASSERT_FALSE(local.is_ok());
        auto r = remote->compile_serialized(spec);
        ASSERT_FALSE(r.is_ok());
        EXPECT_EQ(r.status().code(), local.status().code()) << r.status().to_string();
        EXPECT_EQ(r.status().message(), local.status().message());
        auto h = remote->submit(spec, vocab);
        ASSERT_TRUE(h.is_ok());
        CompileResult c = (*h)->wait_for(kWaitNs);
        ASSERT_FALSE(c.is_ok());
        EXPECT_EQ(c.status().code(), local.status().code());
        EXPECT_EQ(c.status().message(), local.status().message());
    }
}

TEST(CompileServer, ServerDownIsUnavailableQuickly) {
    auto vocab = byte_vocab();
    std::string address;
    {
        auto server = start_server(vocab);
        address = server->address();
    }  // stopped: nothing listens on that port now
    auto remote = client(address, vocab);
    auto t0 = std::chrono::steady_clock::now();
    auto r = remote->compile_serialized(kSpecs[2]);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
    EXPECT_NE(r.status().message().find(address), std::string::npos) << r.status().message();
    auto h = remote->submit(kSpecs[2], vocab);
    ASSERT_TRUE(h.is_ok());
    CompileResult c = (*h)->wait_for(kWaitNs);
    EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
    // Bounded by the connect timeout (2 s), not the 20 s wait guard.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

TEST(CompileServer, OversizedRequestIsRejected) {
    auto vocab = byte_vocab();
    CompileServerOptions o;
    o.max_request_bytes = 1024;
    auto server = start_server(vocab, o);
    auto remote = client(server->address(), vocab);
    GrammarSpec big{GrammarKind::kRegex, std::string(200000, 'a')};
    auto r = remote->compile_serialized(big);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
    EXPECT_NE(r.status().message().find("exceeds the limit of 1024 bytes"), std::string::npos);
    // The server still serves after it.
    EXPECT_TRUE(remote->compile_serialized(kSpecs[2]).is_ok());
}

TEST(CompileServer, TokenizerFingerprintMismatch) {
    auto server = start_server(byte_vocab());
    auto other = byte_vocab(3);
    ASSERT_NE(other->fingerprint(), byte_vocab()->fingerprint());
    auto remote = client(server->address(), other);
    auto r = remote->compile_serialized(kSpecs[2]);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().to_string();
    EXPECT_NE(r.status().message().find("fingerprint"), std::string::npos);
    // And a vocabulary other than the client's own is refused at submit.
    auto h = remote->submit(kSpecs[2], byte_vocab());
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
}

TEST(CompileServer, BusyBeyondMaxConnections) {
    auto vocab = byte_vocab();
    // A compile that waits for a gate: the first request holds the only slot.
    std::mutex mu;
    std::condition_variable cv;
    bool open = false, entered = false;
    CompileServerOptions o;
    o.max_connections = 1;
    o.service.compile = [&](const GrammarSpec& spec) -> Result<Grammar> {
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait_for(lock, std::chrono::seconds(20), [&] { return open; });
        return compile_grammar(spec);
    };
    auto server = start_server(vocab, o);
    auto remote = client(server->address(), vocab);
    Result<std::string> first = unavailable("not run");
    std::thread t([&] { first = remote->compile_serialized(kSpecs[2]); });
    {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return entered; }));
    }
    auto busy = remote->compile_serialized(kSpecs[3]);
    EXPECT_EQ(busy.status().code(), StatusCode::kResourceExhausted) << busy.status().to_string();
    EXPECT_NE(busy.status().message().find("busy"), std::string::npos);
    {
        std::lock_guard<std::mutex> lock(mu);
        open = true;
    }
    cv.notify_all();
    t.join();
    EXPECT_TRUE(first.is_ok()) << first.status().to_string();
}

TEST(CompileServer, GarbageAndBadRequestsGetErrors) {
    auto vocab = byte_vocab();
    auto server = start_server(vocab);
    auto raw = [&](const std::string& bytes) -> Status {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(server->port());
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
        internal::set_io_timeout(fd, 10000);
        EXPECT_TRUE(internal::send_all(fd, bytes).is_ok());
        std::string h, body;
        Status s = internal::recv_exact(fd, 4, &h);
        if (s.is_ok()) s = internal::recv_exact(fd, internal::wire_read_u32(h.data()), &body);
        ::close(fd);
        if (!s.is_ok()) return s;
        return Status(static_cast<StatusCode>(body[0]), body.substr(1));
    };
    auto framed = [](const std::string& body) {
        return std::string(internal::kWireMagic) + internal::wire_u32(static_cast<uint32_t>(body.size())) + body;
    };
    EXPECT_EQ(raw("GET / HTTP/1.1\r\n\r\n").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(raw(framed("not json")).code(), StatusCode::kInvalidArgument);
    std::string fp = internal::fingerprint_hex(vocab->fingerprint());
    Status k = raw(framed(R"({"kind":"cfg","text":"x","vocab_fingerprint":")" + fp + "\"}"));
    EXPECT_EQ(k.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(k.message().find("unknown grammar kind"), std::string::npos);
    EXPECT_TRUE(raw(framed(R"({"kind":"gbnf","text":"root ::= \"a\"","vocab_fingerprint":")" + fp + "\"}")).is_ok());
    Status b = raw(framed(
        R"({"kind":"json_object","flexible_whitespace":"yes","vocab_fingerprint":")" + fp + "\"}"));
    EXPECT_EQ(b.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(b.message().find("'flexible_whitespace' must be a boolean"), std::string::npos)
        << b.to_string();
}

}  // namespace
}  // namespace dsi::grammar
