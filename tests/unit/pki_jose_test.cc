#include "gtest/gtest.h"
#include "pki/base64url.h"
#include "pki/jwe.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"
#include "tests/unit/pki_fixtures.h"

namespace bcd::pki {
namespace {

using bcd::testing::kFixtureNow;
using bcd::testing::NodeFixtures;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

class Jwe : public ::testing::Test {
 protected:
  absl::StatusOr<std::string> Open(const std::string& name, std::string_view rid = "r-1",
                                   std::string_view ref = "secret://db/password") {
    return OpenJwe(NodeFixtures()["jwe"][name].get<std::string>(), recipient_,
                   {kSecretJweType, {{"ref", ref}, {"rid", rid}}, kFixtureNow});
  }
  PrivateKey recipient_ =
      *PrivateKey::FromPem(NodeFixtures()["recipient_pkcs8"].get<std::string>());
};

TEST_F(Jwe, OpensAJoseMadeSecret) {
  absl::StatusOr<std::string> plaintext = Open("valid");
  ASSERT_TRUE(plaintext.ok()) << plaintext.status();
  EXPECT_EQ(*plaintext, "hunter2");
}

TEST_F(Jwe, OpensAJoseMadeWorkloadToken) {
  absl::StatusOr<std::string> token =
      OpenJwe(NodeFixtures()["jwe"]["workload"].get<std::string>(), recipient_,
              {kWorkloadJweType, {{"iid", "i-7"}, {"rid", "r-2"}}, kFixtureNow});
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "eyJ.token.sig");
}

TEST_F(Jwe, RefusesEachBadJwe) {
  EXPECT_EQ(Message(Open("other_alg").status()),
            "JWE refused: alg \"ECDH-ES+A128KW\" is not ECDH-ES+A256KW");
  EXPECT_EQ(Message(Open("other_enc").status()), "JWE refused: enc \"A128GCM\" is not A256GCM");
  EXPECT_EQ(Message(Open("other_typ").status()), "JWE refused: typ \"JWT\" is not bcsecret+jwe");
  EXPECT_EQ(Message(Open("other_ref").status()),
            "JWE refused: ref \"secret://db/other\" does not match the request's "
            "\"secret://db/password\"");
  EXPECT_EQ(Message(Open("other_rid").status()),
            "JWE refused: rid \"r-9\" does not match the request's \"r-1\"");
  EXPECT_EQ(Message(Open("expired").status()),
            "JWE refused: it expired at 1799999999 (now 1800000000)");
  EXPECT_EQ(Message(Open("tampered_tag").status()),
            "JWE refused: it does not authenticate (tampered)");
  EXPECT_EQ(Message(Open("epk_off_curve").status()), "JWE refused: epk is not a point on P-256");
}

TEST_F(Jwe, RefusesAValidJweForAnotherRequest) {
  EXPECT_EQ(Message(Open("valid", "r-2").status()),
            "JWE refused: rid \"r-1\" does not match the request's \"r-2\"");
  EXPECT_EQ(Message(OpenJwe(NodeFixtures()["jwe"]["valid"].get<std::string>(), recipient_,
                            {kWorkloadJweType, {}, kFixtureNow})
                        .status()),
            "JWE refused: typ \"bcsecret+jwe\" is not bcworkload+jwe");
}

TEST_F(Jwe, RefusesAnotherRecipient) {
  EXPECT_EQ(Message(OpenJwe(NodeFixtures()["jwe"]["valid"].get<std::string>(),
                            *PrivateKey::Generate(), {kSecretJweType, {}, kFixtureNow})
                        .status()),
            "JWE refused: the content key does not unwrap (another recipient, or tampered)");
}

TEST_F(Jwe, RefusesMalformedCompactForms) {
  auto open = [&](std::string_view compact) {
    return Message(OpenJwe(compact, recipient_, {kSecretJweType, {}, kFixtureNow}).status());
  };
  EXPECT_EQ(open("a.b.c"), "JWE refused: a compact JWE has 5 parts, got 3");
  EXPECT_EQ(open("!!.b.c.d.e"),
            "JWE refused: the protected header is not base64url of a JSON object");
  EXPECT_EQ(open("W10.b.c.d.e"),
            "JWE refused: the protected header is not base64url of a JSON object");
  EXPECT_EQ(open(std::string(kMaxJweBytes + 1, 'a')),
            "JWE refused: 1048577 bytes is over the bound of 1048576");
}

TEST_F(Jwe, SealsAndOpensItsOwn) {
  std::string compact = *SealJwe("s3cret", recipient_.Public(), kSecretJweType,
                                 {{"ref", "secret://x"}, {"rid", "r"}}, kFixtureNow + 10);
  EXPECT_EQ(*OpenJwe(compact, recipient_,
                     {kSecretJweType, {{"ref", "secret://x"}, {"rid", "r"}}, kFixtureNow}),
            "s3cret");
  EXPECT_EQ(Message(OpenJwe(compact, recipient_, {kSecretJweType, {}, kFixtureNow + 10}).status()),
            "JWE refused: it expired at 1800000010 (now 1800000010)");
}

class Ticket : public ::testing::Test {
 protected:
  absl::StatusOr<TunnelTicket> Verify(const std::string& name, int64_t now = kFixtureNow) {
    return TunnelTicket::Verify(NodeFixtures()["jwt"][name].get<std::string>(),
                                NodeFixtures()["jwks"].get<std::string>(),
                                {"n-1", "sess-1", "tun-1", now});
  }
};

TEST_F(Ticket, VerifiesJoseMadeTickets) {
  absl::StatusOr<TunnelTicket> shell = Verify("valid");
  ASSERT_TRUE(shell.ok()) << shell.status();
  EXPECT_EQ(shell->op(), "shell");
  EXPECT_EQ(shell->jti(), "j-1");
  EXPECT_EQ(shell->rows(), 40);
  EXPECT_EQ(shell->cols(), 120);
  absl::StatusOr<TunnelTicket> exec = Verify("exec");
  ASSERT_TRUE(exec.ok()) << exec.status();
  EXPECT_EQ(exec->cmd(), (std::vector<std::string>{"uname", "-a"}));
  absl::StatusOr<TunnelTicket> tcp = Verify("tcp");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->host(), "127.0.0.1");
  EXPECT_EQ(tcp->port(), 5432);
}

TEST_F(Ticket, RefusesEachBadTicket) {
  EXPECT_EQ(Message(Verify("wrong_aud").status()),
            "tunnel ticket refused: aud \"node:n-2\" is not \"node:n-1\"");
  EXPECT_EQ(Message(Verify("expired").status()),
            "tunnel ticket refused: it expired at 1799999940 (now 1800000000)");
  EXPECT_EQ(Message(Verify("too_long").status()),
            "tunnel ticket refused: lifetime exp - iat = 61 s is not within 1..60 s");
  EXPECT_EQ(Message(Verify("unknown_kid").status()),
            "tunnel ticket refused: kid \"t9\" is not in the access section's JWKS");
  EXPECT_EQ(Message(Verify("wrong_sid").status()),
            "tunnel ticket refused: sid \"sess-2\" is not this session's \"sess-1\"");
  EXPECT_EQ(Message(Verify("alg_none").status()),
            "tunnel ticket refused: alg \"none\" is not allowed (ES256 only)");
  EXPECT_EQ(Message(Verify("hs256").status()),
            "tunnel ticket refused: alg \"HS256\" is not allowed (ES256 only)");
  EXPECT_EQ(Verify("valid").status().code(), absl::StatusCode::kOk);
}

TEST_F(Ticket, ToleratesClockSkewButNoMore) {
  EXPECT_TRUE(Verify("valid", kFixtureNow + 60 + kTicketClockSkew).ok());
  EXPECT_EQ(Message(Verify("valid", kFixtureNow + 61 + kTicketClockSkew).status()),
            "tunnel ticket refused: it expired at 1800000060 (now 1800000071)");
  EXPECT_EQ(Message(Verify("valid", kFixtureNow - kTicketClockSkew - 1).status()),
            "tunnel ticket refused: it is issued in the future, at 1800000000 (now 1799999989)");
}

TEST_F(Ticket, RefusesATicketForAnotherTunnelOrNode) {
  EXPECT_EQ(Message(TunnelTicket::Verify(NodeFixtures()["jwt"]["valid"].get<std::string>(),
                                         NodeFixtures()["jwks"].get<std::string>(),
                                         {"n-1", "sess-1", "tun-2", kFixtureNow})
                        .status()),
            "tunnel ticket refused: tid \"tun-1\" is not the tunnel id \"tun-2\"");
  EXPECT_EQ(Message(TunnelTicket::Verify(NodeFixtures()["jwt"]["valid"].get<std::string>(),
                                         NodeFixtures()["jwks"].get<std::string>(),
                                         {"n-2", "sess-1", "tun-1", kFixtureNow})
                        .status()),
            "tunnel ticket refused: aud \"node:n-1\" is not \"node:n-2\"");
}

TEST_F(Ticket, RefusesATamperedTicket) {
  std::string ticket = NodeFixtures()["jwt"]["valid"].get<std::string>();
  ticket[ticket.find('.') + 5] ^= 1;  // inside the claims
  absl::StatusOr<TunnelTicket> result = TunnelTicket::Verify(
      ticket, NodeFixtures()["jwks"].get<std::string>(), {"n-1", "sess-1", "tun-1", kFixtureNow});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(Ticket, RefusesAJwksKeyWithMembersOfTheWrongType) {
  // Found by the fuzzer: a non-string kty used to throw out of the JSON library.
  std::string jwks = R"({"keys":[{"kty":2,"crv":"P-256","kid":"t1","x":"AA","y":"AA"}]})";
  EXPECT_EQ(Message(TunnelTicket::Verify(NodeFixtures()["jwt"]["valid"].get<std::string>(), jwks,
                                         {"n-1", "sess-1", "tun-1", kFixtureNow})
                        .status()),
            "tunnel ticket refused: JWKS key \"t1\" is not an EC P-256 key");
}

TEST_F(Jwe, RefusesAnEpkWithMembersOfTheWrongType) {
  std::string header =
      R"({"alg":"ECDH-ES+A256KW","enc":"A256GCM","typ":"bcsecret+jwe","epk":{"kty":1}})";
  EXPECT_EQ(Message(OpenJwe(Base64UrlEncode(header) + ".a.b.c.d", recipient_,
                            {kSecretJweType, {}, kFixtureNow})
                        .status()),
            "JWE refused: epk is not an EC P-256 JWK");
}

TEST_F(Ticket, SignsTicketsOfItsOwn) {
  PrivateKey key = *PrivateKey::Generate();
  std::string claims =
      R"({"aud":"node:n-1","jti":"x","iat":100,"exp":160,"sid":"s","tid":"t","op":"instance-tcp","instance":"i-1","port":22})";
  std::string ticket = *SignJwt(claims, key, "k1");
  absl::StatusOr<TunnelTicket> verified =
      TunnelTicket::Verify(ticket, JwksOf(key.Public(), "k1"), {"n-1", "s", "t", 120});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->instance(), "i-1");
  EXPECT_EQ(verified->port(), 22);
}

class Jti : public ::testing::Test {
 protected:
  std::filesystem::path path_ =
      std::filesystem::path(::testing::TempDir()) / ("jti-" + std::to_string(getpid()));
  void TearDown() override { std::filesystem::remove(path_); }
};

TEST_F(Jti, RefusesAReusedJtiAcrossARestart) {
  {
    JtiSet set = *JtiSet::Load(path_);
    EXPECT_TRUE(set.Use("j-1", 160, 100).ok());
    absl::Status again = set.Use("j-1", 160, 101);
    EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(Message(again), "tunnel ticket refused: jti \"j-1\" was used before");
  }
  JtiSet reloaded = *JtiSet::Load(path_);
  EXPECT_EQ(Message(reloaded.Use("j-1", 160, 102)),
            "tunnel ticket refused: jti \"j-1\" was used before");
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(Jti, ForgetsExpiredEntries) {
  JtiSet set = *JtiSet::Load(path_);
  EXPECT_TRUE(set.Use("old", 100, 50).ok());
  EXPECT_TRUE(set.Use("new", 1000, 100 + kTicketClockSkew + 1).ok());
  EXPECT_EQ(set.size(), 1u);
}

TEST_F(Jti, AForgottenJtiCannotComeBackWhenTheClockStepsBack) {
  {
    JtiSet set = *JtiSet::Load(path_);
    ASSERT_TRUE(set.Use("early", 1060, 1000).ok());
    // An hour later (or a clock stepped forward): "early" is forgotten, its exp kept as the floor.
    ASSERT_TRUE(set.Use("later", 4660, 4600).ok());
    EXPECT_EQ(set.size(), 1u);
    EXPECT_EQ(set.floor(), 1060);
  }
  // The clock steps back, and a restart comes between: the replay is still refused.
  JtiSet set = *JtiSet::Load(path_);
  absl::Status replay = set.Use("early", 1060, 1001);
  EXPECT_EQ(replay.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(replay),
            "tunnel ticket refused: it expired at 1060, no later than tickets whose jti were "
            "forgotten (until 1060); its jti cannot be checked");
  EXPECT_TRUE(set.Use("fresh", 1070, 1001).ok()) << "a ticket newer than the floor is checked";
}

TEST(TicketSkew, IsTenSecondsEachWay) {
  PrivateKey key = *PrivateKey::Generate();
  std::string jwks = JwksOf(key.Public(), "k1");
  auto verify = [&](int64_t now) {
    std::string claims =
        R"({"aud":"node:n-1","jti":"x","iat":1000,"exp":1060,"sid":"s","tid":"t","op":"exec","cmd":["true"]})";
    return TunnelTicket::Verify(*SignJwt(claims, key, "k1"), jwks, {"n-1", "s", "t", now}).status();
  };
  EXPECT_TRUE(verify(990).ok());
  EXPECT_EQ(Message(verify(989)),
            "tunnel ticket refused: it is issued in the future, at 1000 (now 989)");
  EXPECT_TRUE(verify(1070).ok());
  EXPECT_EQ(Message(verify(1071)), "tunnel ticket refused: it expired at 1060 (now 1071)");
}

TEST_F(Jti, ACorruptFileIsAnErrorNamingIt) {
  std::ofstream(path_) << "123 ok\nnot-a-number j\n";
  EXPECT_EQ(Message(JtiSet::Load(path_).status()), path_.string() + ":2: corrupt jti entry");
}

}  // namespace
}  // namespace bcd::pki
