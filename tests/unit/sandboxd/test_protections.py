"""The server's own filter and checks, in processes of this host (as root, unconfined)."""

from __future__ import annotations

import json
import subprocess
import sys

from protolink.wire.protections import seccomp_profile

#: Run in a fresh process: set up as told, then try a personality the profile denies
#: (PER_LINUX32), one it allows (the query) and clone3 (ENOSYS in the profile).
PROBE = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[1] == "filtered":
    from protolink_sandboxd.protections import establish
    assert establish() == {}, establish
def call(number, *args):
    result = libc.syscall(ctypes.c_long(number), *map(ctypes.c_ulong, args))
    return 0 if result >= 0 else ctypes.get_errno()
PER_LINUX32, QUERY = 0x0008, 0xFFFFFFFF
print(json.dumps({"personality32": call(135, PER_LINUX32), "query": call(135, QUERY), "clone3": call(435, 0, 0)}))
"""


def probe(mode: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)


def test_the_servers_filter_denies_what_the_profile_denies():
    assert probe("filtered") == {"personality32": 1, "query": 0, "clone3": 38}  # EPERM, allowed, ENOSYS


def test_without_the_filter_the_same_calls_pass():
    assert probe("unfiltered")["personality32"] == 0


MISSING = r"""
import json, sys
from protolink_sandboxd.protections import establish, missing
if sys.argv[1] == "established":
    establish()
print(json.dumps(missing(tcp=False)))
"""


def missing_here(mode: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", MISSING, mode], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)


def test_a_process_of_this_host_lacks_the_sandboxs_protections():
    found = missing_here("bare")
    assert {"no_new_privs", "seccomp", "capabilities", "read_only_root"} <= set(found), found
    assert "SYS_ADMIN" in found["capabilities"]


def test_establishing_them_sets_no_new_privs_and_the_filter():
    found = missing_here("established")
    assert "no_new_privs" not in found and "seccomp" not in found, found


def test_conditions_the_engine_would_read_differently_are_refused():
    profile = json.loads(seccomp_profile())
    profile["syscalls"].append({"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_PTRACE"]}})
    code = ("import json, sys\nfrom protolink_sandboxd import seccomp_filter\n"
            "try:\n    seccomp_filter.load(json.loads(sys.argv[1]))\nexcept ValueError as error:\n    print(error)")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(profile)], capture_output=True, text=True,
                          check=True, timeout=60)
    assert "caps" in done.stdout
