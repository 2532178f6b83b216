#!/usr/bin/python3
"""A Redfish BMC for the dev stack and tests, written from the DMTF Redfish schema (DSP0266,
DSP8010: ServiceRoot, ComputerSystem, SessionService, AccountService).

HTTPS only (TLS 1.2+, its own self-signed P-256 certificate, made with the openssl command);
sessions (X-Auth-Token) and basic auth; ETags on every resource, If-Match on PATCH; a
ComputerSystem per --systems id whose power state follows a reset after --power-delay seconds
(PoweringOn/PoweringOff meanwhile); the boot override; accounts whose passwords can change.

Faults on demand, at start (flags) or later (PATCH /emulator/faults, no auth):
  slow_seconds        every answer waits this long
  no_sessions         POST to Sessions answers 405 (clients fall back to basic auth)
  reset_types         the ResetType@Redfish.AllowableValues list
  boot_targets        the BootSourceOverrideTarget@Redfish.AllowableValues list
  no_boot_mode        the system has no BootSourceOverrideMode
  require_etag        PATCH without If-Match answers 428
  refuse_new_password a changed password is stored but never accepted at login
GET /emulator/state (no auth) tells power, boot, sessions open, the most requests it answered at
once and the request log (method, path, start and end times; no bodies). Prints one JSON line when it listens: {"port", "spki_sha256", "cert"}.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = "/redfish/v1"
SYSTEMS = ROOT + "/Systems"
SESSIONS = ROOT + "/SessionService/Sessions"
ACCOUNTS = ROOT + "/AccountService/Accounts"
ALL_RESETS = ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart",
              "PowerCycle", "Nmi", "PushPowerButton"]
ALL_TARGETS = ["None", "Pxe", "Hdd", "Cd", "BiosSetup", "UefiShell"]


class State:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.power_delay = args.power_delay
        self.systems = {}
        for sid in args.systems.split(","):
            self.systems[sid] = {
                "power": "Off", "target": None, "until": 0.0, "version": 1,
                "boot": {"BootSourceOverrideTarget": "None",
                         "BootSourceOverrideEnabled": "Disabled",
                         "BootSourceOverrideMode": "UEFI"},
            }
        self.accounts = {"1": {"UserName": args.user, "Password": args.password,
                               "RoleId": "Administrator", "version": 1, "changed": False}}
        self.sessions = {}  # id -> (token, user)
        self.next_session = 1
        self.faults = {
            "slow_seconds": args.slow, "no_sessions": args.no_sessions,
            "reset_types": args.reset_types.split(",") if args.reset_types else ALL_RESETS,
            "boot_targets": args.boot_targets.split(",") if args.boot_targets else ALL_TARGETS,
            "no_boot_mode": args.no_boot_mode, "require_etag": args.require_etag,
            "refuse_new_password": False,
        }
        self.log = []
        self.in_flight = 0
        self.max_in_flight = 0  # requests answered at once, most ever

    def power_of(self, system):
        if system["target"] and time.monotonic() >= system["until"]:
            system["power"], system["target"] = system["target"], None
            system["version"] += 1
        if system["target"]:
            return "PoweringOn" if system["target"] == "On" else "PoweringOff"
        return system["power"]

    def set_power(self, system, want):
        now = self.power_of(system)
        if now == want:
            return
        system["target"] = want
        system["until"] = time.monotonic() + self.power_delay
        system["version"] += 1

    def user_for(self, name, password):
        for account in self.accounts.values():
            if account["UserName"] == name and secrets.compare_digest(account["Password"], password):
                if account["changed"] and self.faults["refuse_new_password"]:
                    return None
                return name
        return None


def make_certificate(directory):
    key, cert = os.path.join(directory, "bmc-key.pem"), os.path.join(directory, "bmc-cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "30", "-subj", "/CN=dev-bmc",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    pub = subprocess.run(["openssl", "x509", "-in", cert, "-pubkey", "-noout"],
                         check=True, capture_output=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=pub,
                         check=True, capture_output=True).stdout
    return key, cert, hashlib.sha256(der).hexdigest()


def error_body(status, message):
    return {"error": {"code": "Base.1.8.GeneralError", "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.GeneralError",
                                                 "Message": message}]}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections are kept between requests
    disable_nagle_algorithm = True  # headers and body leave as they are written
    server_version = "dev-bmc"
    state = None

    def log_message(self, *args):
        pass

    # --- plumbing ---
    def send_json(self, status, body, headers=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("OData-Version", "4.0")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if not self.headers.get("User-Agent", "").startswith("bcd/"):
            # Kept connections are for bcd only: now and then this server ends a kept one between
            # two requests (cause not found), which bcd replaces and requests-based clients such
            # as sushy do not.
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        """Reads the request's body whatever the answer will be: on a kept connection, the next
        request starts after it."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > 1 << 16:
            self.close_connection = True
            self.raw_body = None
            return
        self.raw_body = self.rfile.read(length) if length else b""

    def body(self):
        if self.raw_body is None:
            return None
        try:
            return json.loads(self.raw_body) if self.raw_body else {}
        except ValueError:
            return None

    def who(self):
        """The user the request is authenticated as, or None."""
        st = self.state
        token = self.headers.get("X-Auth-Token")
        if token:
            for t, user in st.sessions.values():
                if secrets.compare_digest(t, token):
                    return user
            return None
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return st.user_for(user, password)
        return None

    def handle_any(self, method):
        st = self.state
        path = self.path.split("?")[0].rstrip("/") or "/"
        self.read_body()
        emulator = path.startswith("/emulator")
        entry = {"method": method, "path": path, "start": time.time()}
        with st.lock:
            if not emulator:
                st.log.append(entry)
                st.in_flight += 1
                st.max_in_flight = max(st.max_in_flight, st.in_flight)
            slow = st.faults["slow_seconds"]
        try:
            if slow and not emulator:
                time.sleep(slow)
            with st.lock:
                self.route(method, path)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with st.lock:
                if not emulator:
                    st.in_flight -= 1
                    entry["end"] = time.time()

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_DELETE(self):
        self.handle_any("DELETE")

    # --- resources ---
    def route(self, method, path):
        st = self.state
        if path == "/emulator/state" and method == "GET":
            return self.send_json(200, {
                "systems": {sid: {"power": st.power_of(s), "boot": s["boot"]}
                            for sid, s in st.systems.items()},
                "sessions": len(st.sessions),
                "accounts": {a["UserName"]: {"changed": a["changed"]}
                             for a in st.accounts.values()},
                "max_in_flight": st.max_in_flight,
                "log": st.log[-500:]})
        if path == "/emulator/faults" and method == "PATCH":
            body = self.body()
            if not isinstance(body, dict) or not set(body) <= set(st.faults):
                return self.send_json(400, error_body(400, "unknown fault"))
            st.faults.update(body)
            return self.send_json(200, st.faults)
        if path == "/redfish":
            return self.send_json(200, {"v1": ROOT + "/"})
        if path == ROOT and method == "GET":
            return self.send_json(200, {
                "@odata.id": ROOT, "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                "Id": "RootService", "Name": "Root Service", "RedfishVersion": "1.6.0",
                "UUID": "92384634-2938-2342-8820-489239905423",
                "Systems": {"@odata.id": SYSTEMS},
                "SessionService": {"@odata.id": ROOT + "/SessionService"},
                "AccountService": {"@odata.id": ROOT + "/AccountService"},
                "Links": {"Sessions": {"@odata.id": SESSIONS}}})
        if path == SESSIONS and method == "POST":
            return self.login()
        user = self.who()
        if user is None:
            return self.send_json(401, error_body(401, "authentication required"),
                                  {"WWW-Authenticate": 'Basic realm="dev-bmc"'})
        if path == SYSTEMS and method == "GET":
            return self.collection(SYSTEMS, "#ComputerSystemCollection.ComputerSystemCollection",
                                   "Computer System Collection", st.systems)
        if path.startswith(SYSTEMS + "/"):
            return self.system(method, path[len(SYSTEMS) + 1:])
        if path == ROOT + "/SessionService" and method == "GET":
            return self.send_json(200, {
                "@odata.id": ROOT + "/SessionService",
                "@odata.type": "#SessionService.v1_1_6.SessionService",
                "Id": "SessionService", "Name": "Session Service", "ServiceEnabled": True,
                "SessionTimeout": 600, "Sessions": {"@odata.id": SESSIONS}})
        if path == SESSIONS and method == "GET":
            return self.collection(SESSIONS, "#SessionCollection.SessionCollection",
                                   "Session Collection", st.sessions)
        if path.startswith(SESSIONS + "/"):
            sid = path[len(SESSIONS) + 1:]
            if sid not in st.sessions:
                return self.send_json(404, error_body(404, "no such session"))
            if method == "DELETE":
                del st.sessions[sid]
                return self.send_json(204, None)
            if method == "GET":
                return self.send_json(200, {"@odata.id": path, "@odata.type": "#Session.v1_0_0.Session",
                                            "Id": sid, "Name": "Session",
                                            "UserName": st.sessions[sid][1]})
        if path == ROOT + "/AccountService" and method == "GET":
            return self.send_json(200, {
                "@odata.id": ROOT + "/AccountService",
                "@odata.type": "#AccountService.v1_5_0.AccountService",
                "Id": "AccountService", "Name": "Account Service", "ServiceEnabled": True,
                "MinPasswordLength": 4, "MaxPasswordLength": 64,
                "Accounts": {"@odata.id": ACCOUNTS}})
        if path == ACCOUNTS and method == "GET":
            return self.collection(ACCOUNTS, "#ManagerAccountCollection.ManagerAccountCollection",
                                   "Accounts Collection", st.accounts)
        if path.startswith(ACCOUNTS + "/"):
            return self.account(method, path[len(ACCOUNTS) + 1:])
        return self.send_json(404 if method == "GET" else 405,
                              error_body(404, "no such resource or method"))

    def collection(self, base, odata_type, name, items):
        self.send_json(200, {"@odata.id": base, "@odata.type": odata_type, "Name": name,
                             "Members@odata.count": len(items),
                             "Members": [{"@odata.id": f"{base}/{i}"} for i in items]})

    def login(self):
        st = self.state
        if st.faults["no_sessions"]:
            return self.send_json(405, error_body(405, "sessions are not offered"))
        body = self.body()
        if not isinstance(body, dict):
            return self.send_json(400, error_body(400, "a JSON object is expected"))
        user = st.user_for(str(body.get("UserName", "")), str(body.get("Password", "")))
        if user is None:
            return self.send_json(401, error_body(401, "invalid credentials"))
        sid = str(st.next_session)
        st.next_session += 1
        token = secrets.token_hex(16)
        st.sessions[sid] = (token, user)
        self.send_json(201, {"@odata.id": f"{SESSIONS}/{sid}", "@odata.type": "#Session.v1_0_0.Session",
                             "Id": sid, "Name": "Session", "UserName": user},
                       {"X-Auth-Token": token, "Location": f"{SESSIONS}/{sid}"})

    def etag_check(self, version):
        """None when the PATCH may go on; else the answer was sent."""
        st = self.state
        given = self.headers.get("If-Match")
        if given is None:
            if st.faults["require_etag"]:
                self.send_json(428, error_body(428, "If-Match is required"))
                return False
            return True
        if given not in ("*", f'"{version}"', f'W/"{version}"'):
            self.send_json(412, error_body(412, "the ETag does not match"))
            return False
        return True

    def system(self, method, rest):
        st = self.state
        sid, _, action = rest.partition("/")
        system = st.systems.get(sid)
        if system is None:
            return self.send_json(404, error_body(404, f"no system {sid}"))
        here = f"{SYSTEMS}/{sid}"
        if action == "Actions/ComputerSystem.Reset" and method == "POST":
            body = self.body()
            kind = body.get("ResetType") if isinstance(body, dict) else None
            if kind not in st.faults["reset_types"]:
                return self.send_json(400, error_body(400, f"ResetType {kind} is not allowed"))
            power = st.power_of(system)
            if kind in ("On", "ForceOn"):
                st.set_power(system, "On")
            elif kind in ("ForceOff", "GracefulShutdown"):
                st.set_power(system, "Off")
            elif kind == "PushPowerButton":
                st.set_power(system, "Off" if power == "On" else "On")
            elif kind in ("PowerCycle", "ForceRestart", "GracefulRestart"):
                if power == "Off":
                    st.set_power(system, "On")
                else:  # off for a moment, then on
                    system["power"], system["target"] = "Off", "On"
                    system["until"] = time.monotonic() + st.power_delay
                    system["version"] += 1
            return self.send_json(204, None)
        if action:
            return self.send_json(404, error_body(404, "no such action"))
        if method == "GET":
            boot = dict(system["boot"])
            if st.faults["no_boot_mode"]:
                boot.pop("BootSourceOverrideMode", None)
            else:
                boot["BootSourceOverrideMode@Redfish.AllowableValues"] = ["Legacy", "UEFI"]
            boot["BootSourceOverrideTarget@Redfish.AllowableValues"] = st.faults["boot_targets"]
            boot["BootSourceOverrideEnabled@Redfish.AllowableValues"] = ["Disabled", "Once", "Continuous"]
            power = st.power_of(system)
            version = system["version"]
            return self.send_json(200, {
                "@odata.id": here, "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
                "@odata.etag": f'W/"{version}"', "Id": sid, "Name": f"Dev system {sid}",
                "SystemType": "Physical", "Manufacturer": "bcd", "Model": "dev-bmc",
                "SerialNumber": f"DEV{sid}", "PowerState": power, "Boot": boot,
                "Status": {"State": "Enabled", "Health": "OK"},
                "Actions": {"#ComputerSystem.Reset": {
                    "target": here + "/Actions/ComputerSystem.Reset",
                    "ResetType@Redfish.AllowableValues": st.faults["reset_types"]}}},
                {"ETag": f'W/"{version}"'})
        if method == "PATCH":
            if not self.etag_check(system["version"]):
                return None
            body = self.body()
            boot = body.get("Boot") if isinstance(body, dict) else None
            if not isinstance(boot, dict) or not boot:
                return self.send_json(400, error_body(400, "only Boot can be changed"))
            target = boot.get("BootSourceOverrideTarget")
            if target is not None and target not in st.faults["boot_targets"]:
                return self.send_json(400, error_body(400, f"boot target {target} is not offered"))
            enabled = boot.get("BootSourceOverrideEnabled")
            if enabled is not None and enabled not in ("Disabled", "Once", "Continuous"):
                return self.send_json(400, error_body(400, f"{enabled} is not allowed"))
            mode = boot.get("BootSourceOverrideMode")
            if mode is not None and (st.faults["no_boot_mode"] or mode not in ("UEFI", "Legacy")):
                return self.send_json(400, error_body(400, f"boot mode {mode} is not allowed"))
            for key in ("BootSourceOverrideTarget", "BootSourceOverrideEnabled",
                        "BootSourceOverrideMode"):
                if boot.get(key) is not None:
                    system["boot"][key] = boot[key]
            system["version"] += 1
            return self.send_json(204, None)
        return self.send_json(405, error_body(405, "method not allowed"))

    def account(self, method, aid):
        st = self.state
        account = st.accounts.get(aid)
        if account is None:
            return self.send_json(404, error_body(404, f"no account {aid}"))
        here = f"{ACCOUNTS}/{aid}"
        if method == "GET":
            return self.send_json(200, {
                "@odata.id": here, "@odata.type": "#ManagerAccount.v1_4_0.ManagerAccount",
                "@odata.etag": f'W/"{account["version"]}"', "Id": aid, "Name": "User Account",
                "UserName": account["UserName"], "RoleId": account["RoleId"], "Enabled": True,
                "Locked": False, "Password": None}, {"ETag": f'W/"{account["version"]}"'})
        if method == "PATCH":
            if not self.etag_check(account["version"]):
                return None
            body = self.body()
            password = body.get("Password") if isinstance(body, dict) else None
            if not isinstance(password, str) or not 4 <= len(password) <= 64:
                return self.send_json(400, error_body(400, "a Password of 4 to 64 characters"))
            account["Password"] = password
            account["changed"] = True
            account["version"] += 1
            return self.send_json(204, None)
        return self.send_json(405, error_body(405, "method not allowed"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="where the certificate and key go")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password-file", required=True, help="the account's first password")
    parser.add_argument("--systems", default="1", help="comma-separated system ids")
    parser.add_argument("--power-delay", type=float, default=0.3)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--no-sessions", action="store_true")
    parser.add_argument("--reset-types", default="")
    parser.add_argument("--boot-targets", default="")
    parser.add_argument("--no-boot-mode", action="store_true")
    parser.add_argument("--require-etag", action="store_true")
    args = parser.parse_args()
    with open(args.password_file) as f:
        args.password = f.read().strip()
    key, cert, spki = make_certificate(args.dir)
    Handler.state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(json.dumps({"port": server.server_address[1], "spki_sha256": spki, "cert": cert}),
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
