#include "daemon/tunnels/tunnels.h"

#include <signal.h>

#include <algorithm>

#include "base/mutex.h"
#include "daemon/tunnels/keeper.h"
#include "daemon/tunnels/ops.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

absl::StatusOr<TunnelAccess> TunnelAccess::FromSection(const v1::AccessSection& section,
                                                       uint32_t config_max) {
  TunnelAccess access;
  for (const std::string& op : section.allowed_ops()) {
    if (op != "shell" && op != "exec" && op != "tcp" && op != "instance-tcp") {
      return absl::InvalidArgumentError(fmt::format(
          "allowed_ops: \"{}\" is not shell, exec, tcp or instance-tcp", op.substr(0, 64)));
    }
    access.ops.insert(op);
  }
  if (section.max_tunnels() > kMaxTunnels) {
    return absl::InvalidArgumentError(
        fmt::format("max_tunnels {} is above {}", section.max_tunnels(), kMaxTunnels));
  }
  access.max =
      section.max_tunnels() == 0 ? config_max : std::min(config_max, section.max_tunnels());
  if (!section.tunnel_jwks().empty()) {
    absl::StatusOr<std::size_t> keys = pki::CheckJwks(section.tunnel_jwks());
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("tunnel_jwks: {}", ToStd(keys.status().message())));
    }
  }
  access.jwks = section.tunnel_jwks();
  return access;
}

struct TunnelRunner::Figures {
  explicit Figures(Metrics& m)
      : opened(m.Counter("bcd_tunnels_opened_total", "Tunnels opened, by op", {"op"})),
        refused(m.Counter("bcd_tunnel_refusals_total", "Tunnels refused").Bind({})),
        bytes_in(m.Counter("bcd_tunnel_bytes_total",
                           "Data bytes carried by tunnels: in from the gateway, out to it",
                           {"direction"})
                     .Bind({"in"})),
        bytes_out(m.Counter("bcd_tunnel_bytes_total",
                            "Data bytes carried by tunnels: in from the gateway, out to it",
                            {"direction"})
                      .Bind({"out"})) {}
  CounterFamily& opened;
  Counter refused, bytes_in, bytes_out;
};

// A tunnel's stream, counting the data bytes that pass.
class TunnelRunner::CountedStream : public transport::TunnelStream {
 public:
  CountedStream(std::unique_ptr<transport::TunnelStream> inner, const Figures& figures)
      : inner_(std::move(inner)), figures_(figures) {}
  bool Read(v1::TunnelFrame* frame) override {
    if (!inner_->Read(frame)) return false;
    if (frame->has_data()) figures_.bytes_in.Add(static_cast<double>(frame->data().data().size()));
    return true;
  }
  bool Write(const v1::TunnelFrame& frame) override {
    if (!inner_->Write(frame)) return false;
    if (frame.has_data()) figures_.bytes_out.Add(static_cast<double>(frame.data().data().size()));
    return true;
  }
  void CloseSend() override { inner_->CloseSend(); }
  void Cancel() override { inner_->Cancel(); }
  transport::Refusal Finish() override { return inner_->Finish(); }

 private:
  std::unique_ptr<transport::TunnelStream> inner_;
  const Figures& figures_;
};

TunnelRunner::TunnelRunner(TunnelRunnerOptions options, Logger* log, pki::JtiSet jti)
    : options_(std::move(options)), log_(log), jti_(std::move(jti)) {}

absl::StatusOr<std::unique_ptr<TunnelRunner>> TunnelRunner::Create(TunnelRunnerOptions options,
                                                                   Logger* log) {
  // A tunnel's process or peer may go away while bcd writes to it: that is an error to handle,
  // not a signal that ends the daemon. (Children get the default back before exec.)
  signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<pki::JtiSet> jti = pki::JtiSet::Load(options.state_dir / "tunnel-jti");
  if (!jti.ok()) return jti.status();
  std::unique_ptr<TunnelRunner> runner(new TunnelRunner(std::move(options), log, *std::move(jti)));
  if (runner->options_.metrics == nullptr) {
    runner->own_metrics_ = std::make_unique<Metrics>();
    runner->options_.metrics = runner->own_metrics_.get();
  }
  runner->figures_ = std::make_unique<Figures>(*runner->options_.metrics);
  runner->options_.metrics->Collect(
      "bcd_tunnels_open", "Tunnels open now", MetricType::kGauge, {}, [r = runner.get()] {
        return std::vector<Sample>{{{}, static_cast<double>(r->active())}};
      });
  return runner;
}

TunnelRunner::~TunnelRunner() {
  options_.metrics->Forget("bcd_tunnels_open");
  CloseAll();
}

absl::Status TunnelRunner::Refuse(const std::string& tunnel_id, std::string why) {
  log_->Warn("tunnel.refused", {{"tunnel_id", tunnel_id}, {"reason", why}});
  figures_->refused.Add();
  if (options_.event) {
    options_.event("tunnel.refused", "tunnel refused: " + why, {{"tunnel_id", tunnel_id}});
  }
  return absl::PermissionDeniedError(why);
}

void TunnelRunner::Reap() {
  for (auto it = tunnels_.begin(); it != tunnels_.end();) {
    if ((*it)->done.load()) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      it = tunnels_.erase(it);
    } else {
      ++it;
    }
  }
}

int TunnelRunner::active() const {
  MutexLock lock(mu_);
  int n = 0;
  for (const auto& t : tunnels_) n += !t->done.load();
  return n;
}

void TunnelRunner::CloseAll() {
  std::list<std::shared_ptr<tunnels::Tunnel>> all;
  {
    MutexLock lock(mu_);
    all.swap(tunnels_);
  }
  for (auto& t : all) {
    t->Stop();
    t->stream->Cancel();
  }
  for (auto& t : all) {
    if (t->thread.joinable()) t->thread.join();
  }
}

// The ticket and the access section decide; every refusal names why. Returns the op to run.
absl::StatusOr<std::unique_ptr<tunnels::TunnelOp>> TunnelRunner::Admit(
    const v1::OpenTunnel& open, const std::string& session_id,
    std::optional<pki::TunnelTicket>* ticket_out) {
  const std::string& id = open.tunnel_id();
  absl::StatusOr<TunnelAccess> access = TunnelAccess::FromSection(
      options_.access ? options_.access() : v1::AccessSection(), options_.max);
  if (!access.ok()) {
    return Refuse(id, fmt::format("the access section was not applied: {}",
                                  ToStd(access.status().message())));
  }
  if (access->jwks.empty()) {
    return Refuse(id, "no tunnel keys: the desired state's access section has no tunnel_jwks");
  }
  int64_t now = options_.now();
  absl::StatusOr<pki::TunnelTicket> ticket = pki::TunnelTicket::Verify(
      open.ticket(), access->jwks,
      {.node_id = options_.node_id, .session_id = session_id, .tunnel_id = id, .now = now});
  if (!ticket.ok()) return Refuse(id, std::string(ToStd(ticket.status().message())));
  const std::string& op = ticket->op();
  if (!access->ops.contains(op)) {
    return Refuse(id, fmt::format("op \"{}\" is not in the access section's allowed_ops", op));
  }
  std::unique_ptr<tunnels::TunnelOp> made;
  if (op == "shell" || op == "exec") {
    absl::StatusOr<tunnels::Account> account = tunnels::LookUp(options_.user);
    if (!account.ok()) return Refuse(id, std::string(ToStd(account.status().message())));
    made = op == "shell" ? tunnels::MakeShellOp(*std::move(account), ticket->rows(), ticket->cols())
                         : tunnels::MakeExecOp(*std::move(account), ticket->cmd());
  } else if (op == "instance-tcp") {
    if (!options_.instance_dial) {
      return Refuse(id, "instance-tcp is not offered here (no tunnel.instance-dial)");
    }
    std::optional<std::string> address =
        options_.instance_address ? options_.instance_address(ticket->instance()) : std::nullopt;
    absl::StatusOr<std::string> host =
        address ? absl::StatusOr<std::string>(*address)
                : absl::NotFoundError(fmt::format(
                      "no instance \"{}\" in the desired state's vps section", ticket->instance()));
    made = tunnels::MakeTcpOp(std::move(host), ticket->port(), nullptr, log_);
  } else {  // tcp
    made = tunnels::MakeTcpOp(ticket->host(), ticket->port(), &options_.allow, log_);
  }
  MutexLock lock(mu_);
  Reap();
  if (tunnels_.size() >= access->max) {
    return Refuse(id, fmt::format("{} tunnels are open, the most the access section and "
                                  "[tunnels] max allow",
                                  tunnels_.size()));
  }
  if (absl::Status s = jti_.Use(*ticket, now); !s.ok()) {
    return Refuse(id, absl::IsAlreadyExists(s) ? "the ticket's jti was used before"
                                               : std::string(ToStd(s.message())));
  }
  *ticket_out = *std::move(ticket);
  return made;
}

absl::Status TunnelRunner::Open(const v1::OpenTunnel& open, transport::FrameStream& session,
                                const std::string& session_id) {
  const std::string& id = open.tunnel_id();
  if (id.empty() || id.size() > 128)
    return Refuse(id.substr(0, 128), "a tunnel id of 1 to 128 bytes");
  auto tunnel = std::make_shared<tunnels::Tunnel>();
  tunnel->id = id;
  absl::StatusOr<std::unique_ptr<tunnels::TunnelOp>> op = Admit(open, session_id, &tunnel->ticket);
  if (!op.ok()) return op.status();
  absl::StatusOr<std::unique_ptr<transport::TunnelStream>> stream = session.OpenTunnel();
  if (!stream.ok()) return Refuse(id, std::string(ToStd(stream.status().message())));
  tunnel->stream = std::make_unique<CountedStream>(*std::move(stream), *figures_);
  log_->Info("tunnel.open", {{"tunnel_id", id}, {"op", tunnel->ticket->op()}});
  figures_->opened.Add({tunnel->ticket->op()});
  MutexLock lock(mu_);
  tunnels_.push_back(tunnel);
  tunnel->thread =
      std::thread([this, tunnel, op = *std::move(op)]() mutable { Run(*tunnel, std::move(op)); });
  return absl::OkStatus();
}

void TunnelRunner::Run(tunnels::Tunnel& t, std::unique_ptr<tunnels::TunnelOp> op) {
  v1::TunnelFrame opened;
  opened.mutable_opened()->set_tunnel_id(t.id);
  if (!t.stream->Write(opened)) {
    t.stream->Cancel();
    t.stream->Finish();
    t.done = true;
    return;
  }
  v1::TunnelFrame closed = op->Run(t);
  t.Finish(closed);
  op.reset();  // the op's fds close once the reader is done with them
  t.stream->Finish();
  log_->Info("tunnel.closed",
             {{"tunnel_id", t.id}, {"exit_code", std::to_string(closed.closed().exit_code())}});
  t.done = true;
}

}  // namespace bcd
