#!/usr/bin/python3
"""Drives the dev Redfish BMC with two clients nobody here wrote, Debian's python3-sushy and
redfishtool, through power, the boot override and a password change, and prints what each saw as
one JSON object. Exits non-zero when a client fails.

    redfish_clients.py PORT CERT USER PASSWORD NEW_PASSWORD
"""
import json
import os
import subprocess
import sys
import time

import requests
import sushy
import urllib3


def redfishtool(port, user, password, *args):
    run = subprocess.run(["redfishtool", "-r", f"127.0.0.1:{port}", "-u", user, "-p", password,
                          "-S", "Always", *args], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise SystemExit(f"redfishtool {' '.join(args)}: {run.returncode} {run.stderr}")
    return run.stdout


def wait_power(system, want):
    for _ in range(50):
        system.refresh()
        if system.power_state == want:
            return
        time.sleep(0.1)
    raise SystemExit(f"sushy: power stayed {system.power_state}, not {want}")


def main():
    port, cert, user, password, new_password = sys.argv[1:6]
    seen = {}
    # sushy verifies the certificate: requests takes its CA bundle from the environment first.
    os.environ["REQUESTS_CA_BUNDLE"] = cert
    root = sushy.Sushy(f"https://127.0.0.1:{port}", username=user, password=password, verify=cert)
    # A kept connection the server closed while it was idle is legal HTTP; requests does not try
    # again by itself (bcd does, once): let GETs be tried again, as a careful client would.
    root._conn._session.mount("https://", requests.adapters.HTTPAdapter(
        max_retries=urllib3.util.retry.Retry(total=2, connect=2, read=2, status=0)))
    members = root.get_system_collection().get_members()
    seen["sushy_systems"] = [m.identity for m in members]
    system = members[0]
    seen["sushy_power_before"] = str(system.power_state.value)
    seen["sushy_allowed_resets"] = sorted(v.value for v in system.get_allowed_reset_system_values())
    system.reset_system(sushy.ResetType.ON)
    wait_power(system, sushy.PowerState.ON)
    seen["sushy_power_after_on"] = str(system.power_state.value)
    system.set_system_boot_options(sushy.BootSource.PXE,
                                   enabled=sushy.BootSourceOverrideEnabled.CONTINUOUS,
                                   mode=sushy.BootSourceOverrideMode.UEFI)
    system.refresh()
    seen["sushy_boot"] = [system.boot.target.value, system.boot.enabled.value,
                          system.boot.mode.value]
    root.close() if hasattr(root, "close") else None

    redfishtool(port, user, password, "Systems", "-I", system.identity, "reset", "ForceOff")
    for _ in range(50):
        state = json.loads(redfishtool(port, user, password, "-P", "PowerState", "Systems", "-I",
                                       system.identity, "get"))
        if state["PowerState"] == "Off":
            break
        time.sleep(0.1)
    seen["redfishtool_power_after_off"] = state["PowerState"]
    redfishtool(port, user, password, "Systems", "-I", system.identity, "setBootOverride",
                "Once", "Hdd")
    boot = json.loads(redfishtool(port, user, password, "-P", "Boot", "Systems", "-I",
                                  system.identity, "get"))["Boot"]
    seen["redfishtool_boot"] = [boot["BootSourceOverrideTarget"], boot["BootSourceOverrideEnabled"]]
    redfishtool(port, user, password, "AccountService", "setpassword", user, new_password)
    state = json.loads(redfishtool(port, user, new_password, "-P", "PowerState", "Systems", "-I",
                                   system.identity, "get"))
    seen["redfishtool_login_with_new_password"] = state["PowerState"]
    print(json.dumps(seen, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
