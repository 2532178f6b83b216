#include "gtest/gtest.h"
#include "pki/issue.h"
#include "pki/x509.h"
#include "proto/absl_compat.h"
#include "tests/unit/pki_fixtures.h"

namespace bcd::pki {
namespace {

using bcd::testing::Cert;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

Certificate Load(const std::string& name) { return *Certificate::FromPem(Cert(name + ".pem")); }

std::vector<Certificate> Chain(const std::string& leaf) {
  return {Load(leaf), Load("intermediate")};
}

int64_t Inside() { return Load("node").NotBefore() + 86400; }

TEST(OpensslFixtures, NodeChainVerifiesToTheRoot) {
  EXPECT_TRUE(VerifyChain(Chain("node"), {Load("root")}, Inside()).ok());
}

TEST(OpensslFixtures, AnIntermediateCanBeTheAnchor) {
  EXPECT_TRUE(VerifyChain({Load("node")}, {Load("intermediate")}, Inside()).ok());
}

TEST(OpensslFixtures, RefusesAnExpiredLeaf) {
  absl::Status status = VerifyChain(Chain("node"), {Load("root")}, Load("node").NotAfter() + 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Message(status), "CN = n-1: certificate has expired");
}

TEST(OpensslFixtures, RefusesALeafNotYetValid) {
  EXPECT_EQ(Message(VerifyChain(Chain("node"), {Load("root")}, Load("node").NotBefore() - 1)),
            "CN = n-1: certificate is not yet valid");
}

TEST(OpensslFixtures, RefusesAChainToAnotherRoot) {
  EXPECT_EQ(Message(VerifyChain({Load("other-node")}, {Load("root")}, Inside())),
            "CN = n-1: unable to get local issuer certificate");
  EXPECT_EQ(Message(VerifyChain(Chain("node"), {Load("other-root")}, Inside())),
            "CN = n-1: unable to get local issuer certificate");
}

TEST(OpensslFixtures, RefusesWithNoAnchors) {
  EXPECT_EQ(Message(VerifyChain(Chain("node"), {}, Inside())),
            "no trust anchors to verify against");
}

TEST(OpensslFixtures, ParsesPemBundlesAndDerChains) {
  std::vector<Certificate> chain = *ParsePemChain(Cert("node.pem") + Cert("intermediate.pem"));
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[1].Subject(), "CN = bcd test node CA");
  std::vector<Certificate> again = *ParseDerChain({chain[0].Der(), chain[1].Der()});
  EXPECT_EQ(again[0].Der(), chain[0].Der());
  EXPECT_EQ(Message(ParsePemChain("nothing here").status()), "no PEM certificate found");
  EXPECT_EQ(Message(ParseDerChain({chain[0].Der(), "junk"}).status()).substr(0, 41),
            "chain certificate 1: not a DER certificat");
  EXPECT_EQ(Message(Certificate::FromPem(Cert("node.pem") + Cert("root.pem")).status()),
            "expected one PEM certificate, found 2");
}

TEST(OpensslFixtures, ACertificateCutShortOrDamagedIsRefusedNotDropped) {
  std::string node = Cert("node.pem"), second = Cert("intermediate.pem");
  // Cut inside the base64 (no END line), and a whole block whose base64 is damaged.
  std::string cut = node + second.substr(0, second.size() / 2);
  std::string damaged = node + second.substr(0, 64) + "%" + second.substr(65);
  for (const std::string& pem : {cut, damaged}) {
    absl::StatusOr<std::vector<Certificate>> chain = ParsePemChain(pem);
    ASSERT_FALSE(chain.ok()) << "read " << chain->size() << " certificates";
    EXPECT_EQ(Message(chain.status()).substr(0, 43), "PEM certificate 2 is damaged or cut short: ");
  }
}

TEST(OpensslFixtures, SpkiPinMatchesOpenssl) {
  for (const char* name : {"root", "intermediate", "signing-root"}) {
    std::string expected = Cert(std::string(name) + ".spki-sha256");
    expected.erase(expected.find_last_not_of("\n") + 1);
    EXPECT_EQ(Hex(Load(name).SpkiSha256()), expected) << name;
  }
}

TEST(OpensslFixtures, NodeIdentityComesFromTheOneSpiffeSan) {
  NodeIdentity identity = *IdentityOf(Load("node"));
  EXPECT_EQ(identity.id.ToString(), "spiffe://example.net/site/fra1/node/n-1");
  EXPECT_EQ(identity.id.trust_domain(), "example.net");
  EXPECT_EQ(identity.id.site(), "fra1");
  EXPECT_EQ(identity.id.node(), "n-1");
  EXPECT_EQ(identity.generation, 3u);
  EXPECT_FALSE(identity.tenant_controlled);
}

TEST(OpensslFixtures, UrnStatementsAreStatementsNotIdentity) {
  NodeIdentity identity = *IdentityOf(Load("tenant"));
  EXPECT_EQ(identity.id.node(), "n-2");
  EXPECT_TRUE(identity.tenant_controlled);
  EXPECT_EQ(identity.generation, std::nullopt);
}

TEST(OpensslFixtures, RefusesTwoSpiffeSans) {
  EXPECT_EQ(Message(IdentityOf(Load("two-spiffe")).status()),
            "CN = two: a node certificate needs exactly one SPIFFE URI SAN, found 2");
}

TEST(OpensslFixtures, RefusesNoSpiffeSan) {
  EXPECT_EQ(Message(IdentityOf(Load("no-spiffe")).status()),
            "CN = none: a node certificate needs exactly one SPIFFE URI SAN, found 0");
}

TEST(OpensslFixtures, RefusesASpiffeIdThatIsNotANode) {
  EXPECT_EQ(Message(IdentityOf(Load("bad-path")).status()),
            "\"spiffe://example.net/node/n-1\" is not a node SPIFFE id: the path is not "
            "/site/<site>/node/<node>");
}

TEST(SpiffeId, ParsesAndRefuses) {
  EXPECT_TRUE(SpiffeId::Parse("spiffe://td.example/site/s_1/node/n-1.a").ok());
  for (const char* bad :
       {"spiffe://", "spiffe://td", "https://td/site/s/node/n", "spiffe://TD/site/s/node/n",
        "spiffe://td/site/s/node/n/x", "spiffe://td/site//node/n", "spiffe://td/site/s/node/..",
        "spiffe://td/site/s/node/n?x=1", "spiffe://td:443/site/s/node/n",
        "spiffe://u@td/site/s/node/n", "spiffe://td/site/s/nodes/n"}) {
    EXPECT_FALSE(SpiffeId::Parse(bad).ok()) << bad;
  }
  EXPECT_EQ(SpiffeId::Make("td", "s", "n")->ToString(), "spiffe://td/site/s/node/n");
}

TEST(Csr, OpensslMadeCsrVerifies) {
  absl::StatusOr<PublicKey> key = VerifyCsr(Cert("node.csr.der"));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->SpkiDer(), Load("node").SpkiDer());
}

TEST(Csr, OurCsrVerifiesAndCarriesOurKey) {
  PrivateKey key = *PrivateKey::Generate();
  std::string csr = *CreateCsr(key, "n-1");
  EXPECT_EQ(VerifyCsr(csr)->SpkiDer(), key.Public().SpkiDer());
}

TEST(Csr, RefusesATamperedCsr) {
  std::string csr = *CreateCsr(*PrivateKey::Generate(), "n-1");
  csr[csr.size() / 3] ^= 0x01;  // inside the signed request info
  absl::StatusOr<PublicKey> key = VerifyCsr(csr);
  EXPECT_FALSE(key.ok());
  EXPECT_FALSE(VerifyCsr(csr + "x").ok());
}

}  // namespace
}  // namespace bcd::pki

namespace bcd::pki {
namespace {

TEST(Issue, IssuesAChainThatVerifiesAndCarriesItsIdentity) {
  PrivateKey ca_key = *PrivateKey::Generate();
  Certificate ca = *IssueCertificate(
      {.common_name = "dev CA", .not_before = 1000, .not_after = 100000, .is_ca = true},
      ca_key.Public(), ca_key, nullptr);
  PrivateKey leaf_key = *PrivateKey::Generate();
  Certificate leaf =
      *IssueCertificate({.common_name = "n-1",
                         .uri_sans = {"spiffe://dev.test/site/s1/node/n-1", "urn:bc:generation:4"},
                         .not_before = 1000,
                         .not_after = 2000,
                         .client_auth = true},
                        leaf_key.Public(), ca_key, &ca);
  EXPECT_TRUE(VerifyChain({leaf}, {ca}, 1500).ok());
  EXPECT_FALSE(VerifyChain({leaf}, {ca}, 2001).ok());
  NodeIdentity id = *IdentityOf(leaf);
  EXPECT_EQ(id.id.node(), "n-1");
  EXPECT_EQ(id.generation, 4u);
  EXPECT_EQ(leaf.NotAfter(), 2000);
}

}  // namespace
}  // namespace bcd::pki
