"""Escape and privilege: every way out of the container or up to root fails, the sandbox serves on."""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import stat
import struct

import pytest

from protolink.sandbox.docker import seccomp_profile

from .conftest import CANARY, CANARY_VARIABLE, GVISOR, NO_ROUTE, NOBODY, PYTHON, Roots, figure, still_serves

pytestmark = pytest.mark.docker

#: System call numbers (x86_64, aarch64) of what a command must never be able to call: Docker's
#: documented default blocks, plus the new mount API and io_uring that our profile also refuses.
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "acct": (163, 89), "add_key": (248, 217), "bpf": (321, 280), "clock_adjtime": (305, 266),
    "clock_settime": (227, 112), "create_module": (174, None), "delete_module": (176, 106),
    "finit_module": (313, 273), "get_kernel_syms": (177, None), "get_mempolicy": (239, 236),
    "init_module": (175, 105), "ioperm": (173, None), "iopl": (172, None), "kcmp": (312, 272),
    "kexec_file_load": (320, 294), "kexec_load": (246, 104), "keyctl": (250, 219), "lookup_dcookie": (212, 18),
    "mbind": (237, 235), "mount": (165, 40), "move_pages": (279, 239), "name_to_handle_at": (303, 264),
    "nfsservctl": (180, None), "open_by_handle_at": (304, 265), "perf_event_open": (298, 241),
    "pivot_root": (155, 41), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "ptrace": (101, 117), "query_module": (178, None), "quotactl": (179, 60), "reboot": (169, 142),
    "request_key": (249, 218), "set_mempolicy": (238, 237), "setns": (308, 268), "settimeofday": (164, 170),
    "swapon": (167, 224), "swapoff": (168, 225), "sysfs": (139, None), "_sysctl": (156, None),
    "umount2": (166, 39), "unshare": (272, 97), "uselib": (134, None), "userfaultfd": (323, 282),
    "ustat": (136, None), "chroot": (161, 51), "syslog": (103, 116), "vhangup": (153, 58),
    "io_uring_setup": (425, 425), "clone3": (435, 435), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "sched_setscheduler": (144, 119), "sched_setattr": (314, 274),
}
REFUSED = (errno.EPERM, errno.ENOSYS)
SYSCALL_PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}
for name, number in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    answer = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(0)] * 6)
    results[name] = 0 if answer != -1 else ctypes.get_errno()
print(json.dumps(results))
"""

SERVER_PID = r"""
import json, os
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        command = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
        uid = int(open(f'/proc/{pid}/status').read().split('\nUid:')[1].split()[0])
    except OSError:
        continue
    if uid == 0 and b'-m' in command and b'protolink_sandboxd' in command:
        server = int(pid)
"""


def _numbers() -> dict[str, int]:
    column = {"x86_64": 0, "aarch64": 1}[platform.machine()]
    return {name: numbers[column] for name, numbers in SYSCALLS.items() if numbers[column] is not None}


def _unconditionally_allowed() -> set[str]:
    profile = json.loads(seccomp_profile())
    return {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
            for name in rule["names"]}


async def test_seccomp_deny_list(attacker):
    """Every system call Docker's default profile blocks (plus the new mount API, io_uring, scheduling policy), called by a command.

    Each one fails with EPERM or ENOSYS, and none of them is allowed by the profile. Under gVisor too, where the engine applies no profile inside: the server's own filter, from the same profile, refuses them.
    """
    results = await attacker.probe(SYSCALL_PROBE, json.dumps(_numbers()))
    assert {name: code for name, code in results.items() if code not in REFUSED} == {}
    assert not set(SYSCALLS) & _unconditionally_allowed()
    await still_serves(attacker)


async def test_mount(attacker):
    """Mounting a tmpfs and bind-remounting / read-write, with the image's setuid-root mount(8) and with mount(2).

    mount(8) does not gain root (no-new-privileges); mount(2) is refused; /proc/mounts is unchanged.
    """
    before = await attacker.run(["/bin/cat", "/proc/mounts"])
    result = await attacker.shell("mkdir -p /tmp/m; mount -t tmpfs none /tmp/m; mount -o remount,rw /; "
                                  "mount --bind / /tmp/m; echo done")
    assert result.stdout == "done\n" and result.stderr.count("must be superuser") == 3
    probe = await attacker.probe(SYSCALL_PROBE, json.dumps({"mount": _numbers()["mount"]}))
    assert probe["mount"] in REFUSED
    assert (await attacker.run(["/bin/cat", "/proc/mounts"])).stdout == before.stdout
    await still_serves(attacker)


async def test_unshare(attacker):
    """Creating user, mount, pid and network namespaces with unshare(1) and clone(2) namespace flags.

    unshare(2) and namespace flags on clone(2) are refused by the profile (under gVisor, by the server's own filter from the same profile).
    """
    result = await attacker.shell("unshare -U id; unshare -Urm id; unshare -n id; unshare -p -f id; echo done")
    assert result.stdout == "done\n" and result.stderr.count("Operation not permitted") == 4
    code = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x00020000, 0x40000000, 17
answers = {}
for name, flag in {"newuser": CLONE_NEWUSER, "newns": CLONE_NEWNS, "newnet": CLONE_NEWNET}.items():
    pid = libc.syscall(56 if os.uname().machine == 'x86_64' else 220, flag | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    answers[name] = ctypes.get_errno() if pid == -1 else 0
print(json.dumps(answers))
"""
    answers = await attacker.probe(code)
    assert all(code in REFUSED for code in answers.values()), answers
    await still_serves(attacker)


async def test_ptrace_the_server(attacker):
    """Attaching to the sandbox server with ptrace, reading its memory with process_vm_readv and /proc/PID/mem.

    All refused: the profile has no ptrace, the server runs as root (another uid) and is non-dumpable. gVisor does not honour non-dumpable for the server's environ and maps: they are readable there (the environment holds no secret, test_reading_host_environment; the maps show the server's address layout), its memory is not.
    """
    code = SERVER_PID + r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
answers = {}
answers['ptrace'] = ctypes.get_errno() if libc.ptrace(16, server, 0, 0) == -1 else 0  # PTRACE_ATTACH
for path in (f'/proc/{server}/mem', f'/proc/{server}/environ', f'/proc/{server}/maps'):
    try:
        open(path, 'rb').read(1)
        answers[path] = 0
    except OSError as error:
        answers[path] = error.errno
local = (ctypes.c_char * 16)()
iov = (ctypes.c_void_p * 2)(ctypes.addressof(local), 16)
remote = (ctypes.c_void_p * 2)(0x400000, 16)
ret = libc.process_vm_readv(server, iov, 1, remote, 1, 0)
answers['process_vm_readv'] = ctypes.get_errno() if ret == -1 else 0
print(json.dumps(answers))
"""
    answers = await attacker.probe(code)
    assert answers.pop("ptrace") in REFUSED and answers.pop("process_vm_readv") in REFUSED
    if GVISOR:
        answers = {path: code for path, code in answers.items() if not path.endswith(("/environ", "/maps"))}
    assert set(answers.values()) <= {errno.EACCES, errno.EPERM}, answers
    assert any(path.endswith("/mem") for path in answers)
    await still_serves(attacker)


async def test_kernel_modules(attacker):
    """Loading and removing kernel modules (insmod-style init_module/finit_module, delete_module).

    Refused by the profile (and no CAP_SYS_MODULE); the image has no /lib/modules to load from.
    """
    numbers = _numbers()
    probe = await attacker.probe(SYSCALL_PROBE, json.dumps({name: numbers[name] for name in
                                                            ("init_module", "finit_module", "delete_module")}))
    assert set(probe.values()) <= set(REFUSED)
    listing = await attacker.run([PYTHON, "-c", "import os; os.listdir('/lib/modules')"])
    assert "No such file or directory" in listing.stderr
    await still_serves(attacker)


async def test_bpf(attacker):
    """Loading a BPF program (BPF_PROG_LOAD of a socket filter) with real arguments.

    Refused with EPERM by the profile.
    """
    code = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
insns = (ctypes.c_uint64 * 2)(0x00000000000000b7, 0x0000000000000095)  # r0 = 0; exit
license = ctypes.create_string_buffer(b'GPL')
attr = (ctypes.c_uint32 * 32)()
attr[0] = 1  # BPF_PROG_TYPE_SOCKET_FILTER
attr[1] = 2  # instruction count
ctypes.memmove(ctypes.addressof(attr) + 8, ctypes.byref(ctypes.c_uint64(ctypes.addressof(insns))), 8)
ctypes.memmove(ctypes.addressof(attr) + 16, ctypes.byref(ctypes.c_uint64(ctypes.addressof(license))), 8)
number = 321 if os.uname().machine == 'x86_64' else 280
answer = libc.syscall(number, 5, ctypes.byref(attr), ctypes.sizeof(attr))  # BPF_PROG_LOAD
print(json.dumps({'bpf': ctypes.get_errno() if answer == -1 else 0}))
"""
    assert (await attacker.probe(code))["bpf"] == errno.EPERM
    await still_serves(attacker)


async def test_keyctl(attacker):
    """Adding a key to the session keyring and reading the user keyring (add_key, keyctl, request_key).

    Refused by the profile (under gVisor, by the server's own filter from the same profile): the kernel keyring is not namespaced and would be shared with the host.
    """
    code = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
answers = {}
answers['add_key'] = ctypes.get_errno() if libc.syscall(248, b'user', b'stolen', b'secret', 6, -3) == -1 else 0
answers['keyctl'] = ctypes.get_errno() if libc.syscall(250, 0, -4, 0, 0, 0) == -1 else 0  # KEYCTL_GET_KEYRING_ID
answers['request_key'] = ctypes.get_errno() if libc.syscall(249, b'user', b'x', 0, 0) == -1 else 0
print(json.dumps(answers))
"""
    if platform.machine() != "x86_64":
        code = code.replace("248,", "217,").replace("250,", "219,").replace("249,", "218,")
    assert set((await attacker.probe(code)).values()) == {errno.EPERM}
    await still_serves(attacker)


async def test_setuid_binary_in_writable_root(attacker):
    """Copying a shell into the writable root, making it setuid and chowning it to root; running the image's setuid-root su/mount.

    The file stays the command uid's (chown to root refused), so the host never sees a setuid-root binary; setuid-root binaries of the image gain nothing (no-new-privileges).
    """
    result = await attacker.shell("cp /bin/dash sh && chmod 4755 sh; chown 0:0 sh; chmod u+s /usr/bin/su; "
                                  "/usr/bin/su -c id root </dev/null; /usr/bin/newgrp root </dev/null; id -u")
    copied = (attacker.ws / "sh").stat()
    assert copied.st_uid == NOBODY and not (copied.st_mode & stat.S_ISUID and copied.st_uid == 0)
    assert result.stdout.splitlines()[-1] == str(NOBODY)
    assert "Operation not permitted" in result.stderr
    await still_serves(attacker)


async def test_commands_never_run_as_root(attacker):
    """Becoming root from a command: setuid(0), setresuid, setgid, setgroups, setpriv --reuid=0.

    Commands run as uid and gid 65534 with no supplementary groups; every attempt fails with EPERM.
    """
    code = r"""
import json, os
answers = {'ids': [os.getuid(), os.geteuid(), os.getgid(), os.getegid()], 'groups': os.getgroups()}
for name, call in {'setuid': lambda: os.setuid(0), 'setresuid': lambda: os.setresuid(0, 0, 0),
                   'setgid': lambda: os.setgid(0), 'setgroups': lambda: os.setgroups([0])}.items():
    try:
        call()
        answers[name] = 0
    except OSError as error:
        answers[name] = error.errno
print(json.dumps(answers))
"""
    answers = await attacker.probe(code)
    assert answers["ids"] == [NOBODY] * 4 and answers["groups"] == []
    assert [answers[name] for name in ("setuid", "setresuid", "setgid", "setgroups")] == [errno.EPERM] * 4
    elevated = await attacker.shell("setpriv --reuid=0 id -u")
    assert elevated.exit_code != 0
    await still_serves(attacker)


#: The container's bounding set, which every process in it inherits: CAP_KILL, CAP_SETGID, CAP_SETUID.
BOUNDING = 1 << 5 | 1 << 6 | 1 << 7
#: ``struct vfs_cap_data`` (revision 2, effective): the bounding set's capabilities permitted. A file
#: that names capabilities outside the bounding set does not even run (EPERM: it would run without them).
FILE_CAPABILITIES = struct.pack("<5I", 0x02000000 | 0x000001, BOUNDING, 0, 0, 0)
CREDENTIALS = r"""
import ctypes, json, os, sys
def status(path):
    lines = [line.split(':', 1) for line in open(path).read().splitlines() if ':' in line]
    return {name: value.split() for name, value in lines}
answers = status('/proc/self/status')
# Asked of the kernel itself too: gVisor's status has no CapAmb or NoNewPrivs line.
libc = ctypes.CDLL(None, use_errno=True)
answers['ambient'] = [cap for cap in range(64) if libc.prctl(47, 1, cap, 0, 0) == 1]  # PR_CAP_AMBIENT_IS_SET
answers['no_new_privs'] = libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
answers['execs'] = {name: status(name + '.status') for name in sys.argv[2:]}
answers['files'] = {name: [os.stat(name).st_uid, os.stat(name).st_mode & 0o7777] for name in sys.argv[2:]}
answers['mount_options'] = [line.split()[5] for line in open('/proc/self/mountinfo') if line.split()[4] == sys.argv[1]]
print(json.dumps(answers))
"""


async def test_capabilities_of_commands(attacker, roots: Roots):
    """What a command holds (its capability sets and no_new_privs in /proc/self/status), and what it gains by executing a setuid-root copy of cat and a copy with the bounding set's three as file capabilities (the host, as root, made both in the writable root, which is not mounted nosuid; a command cannot make either).

    A command's effective, permitted, inheritable and ambient sets are empty; its bounding set is the container's (SETUID, SETGID, KILL) and no_new_privs is set. The bounding set only caps what an exec of such a binary may add, and no_new_privs makes the kernel ignore setuid bits and file capabilities: both copies run as uid 65534 with the same empty sets. Under gVisor (no CapAmb or NoNewPrivs lines in status) the same holds.
    """
    copied = await attacker.run(["/bin/cp", "/bin/cat", "image-cat"])
    assert copied.exit_code == 0, copied
    # Made under names the sandbox has not looked up yet: gVisor's view of a file whose owner the
    # host changed after the Sentry had seen it is not to be relied on.
    binaries = {"setuid-cat": 0o4755, "caps-cat": 0o755}
    for name, mode in binaries.items():
        shutil.copyfile(attacker.ws / "image-cat", attacker.ws / name)
        (attacker.ws / name).chmod(mode)  # root's already: the host made it
    os.setxattr(attacker.ws / "caps-cat", "security.capability", FILE_CAPABILITIES)
    ran = await attacker.shell("./setuid-cat /proc/self/status > setuid-cat.status && "
                               "./caps-cat /proc/self/status > caps-cat.status && echo ran")
    assert ran.stdout == "ran\n", ran
    answers = await attacker.probe(CREDENTIALS, str(roots.work), *binaries)
    assert answers["files"] == {name: [0, mode] for name, mode in binaries.items()}
    [options] = answers["mount_options"]
    assert "nosuid" not in options.split(","), "with nosuid this would prove nosuid, not no_new_privs"
    assert answers["ambient"] == [] and answers["no_new_privs"] == 1
    for status in (answers, *answers["execs"].values()):
        assert status["Uid"] == status["Gid"] == [str(NOBODY)] * 4, status
        assert {int(status[name][0], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapAmb") if name in status} == {0}
        assert int(status["CapBnd"][0], 16) == BOUNDING, status
        assert status.get("NoNewPrivs", ["1"]) == ["1"], status
    figure("capabilities of a command and of its setuid-root and file-capability execs",
           f"CapBnd {answers['CapBnd'][0]}, every other set 0, no_new_privs 1")
    await still_serves(attacker)


@pytest.mark.parametrize("target", ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
                                    "/proc/sysrq-trigger", "/proc/sys/kernel/modprobe"])
async def test_writing_proc_sys(attacker, target):
    """Writing kernel settings through /proc/sys (core_pattern, modprobe, drop_caches) and /proc/sysrq-trigger.

    Refused: /proc/sys is mounted read-only (or the file is absent) and the command has neither root nor capabilities.
    """
    before = await attacker.run(["/bin/sh", "-c", f"cat {target} 2>/dev/null"])
    result = await attacker.shell(f"echo '|/tmp/evil' > {target}")
    assert result.exit_code != 0
    assert any(reason in result.stderr for reason in ("Read-only file system", "Permission denied", "nonexistent"))
    assert (await attacker.run(["/bin/sh", "-c", f"cat {target} 2>/dev/null"])).stdout == before.stdout
    await still_serves(attacker)


async def test_writing_sys(attacker):
    """Writing /sys: the uevent helper, a cgroup limit of the container, and a device's power control.

    Refused: /sys (cgroups included) is mounted read-only (gVisor has no cgroup files inside).
    """
    result = await attacker.shell("echo /tmp/evil > /sys/kernel/uevent_helper; "
                                  "echo -1 > /sys/fs/cgroup/pids/pids.max; "
                                  "echo max > /sys/fs/cgroup/memory/memory.limit_in_bytes; echo done")
    assert result.stdout == "done\n"
    # gVisor mounts no cgroup file system inside at all: the cgroup files do not exist.
    refusals = ("Read-only file system", "Permission denied") + (("Directory nonexistent",) if GVISOR else ())
    assert sum(result.stderr.count(reason) for reason in refusals) == 3, result.stderr
    limit = await attacker.run(["/bin/cat", "/sys/fs/cgroup/pids/pids.max"])
    assert limit.stdout.strip() != "max"
    await still_serves(attacker)


async def test_reading_host_files(attacker, roots: Roots):
    """Looking for the host's files: a secret next to the mounted roots, the host's /root and /home, and every mount's source.

    Only the roots exist at their host paths; every other bind mount is Docker's own hosts/hostname/resolv.conf or the socket directory (root-only).
    """
    secret = roots.base / "host-secret.txt"
    code = r"""
import json, os, sys
seen = {path: os.path.lexists(path) for path in sys.argv[2:]}
mounts = [line.split()[3] for line in open('/proc/self/mountinfo')]
print(json.dumps({'seen': seen, 'beside_roots': os.listdir(sys.argv[1]), 'mount_sources': mounts}))
"""
    paths = [str(secret), "/root/.bash_history", "/root/.ssh", "/var/lib/docker", f"/proc/1/root{secret}"]
    answers = await attacker.probe(code, str(roots.base), *paths)
    assert not any(answers["seen"].values()), answers["seen"]
    assert set(answers["beside_roots"]) <= {roots.work.name, roots.ro.name}  # mount points only
    allowed = {str(roots.work), str(roots.ro), "/"}
    docker_files = ("/hostname", "/hosts", "/resolv.conf")
    for source in answers["mount_sources"]:
        assert (source in allowed or source.endswith(docker_files) or "protolink-sandbox-" in source
                or not source.startswith(("/tmp", "/root", "/home", "/etc", "/var", "/srv", "/opt", "/work"))), source
    reading = await attacker.shell(f"cat {secret} /proc/1/root{secret} 2>&1; echo done")
    assert CANARY not in reading.stdout
    await still_serves(attacker)


async def test_reading_host_environment(attacker, sandbox):
    """Looking for the host process's environment (a canary variable set while the sandbox started) in env and every /proc/PID/environ.

    The container gets an empty environment; the server's environ is unreadable (another uid, non-dumpable).
    """
    code = r"""
import json, os
readable = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        readable[pid] = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')
    except OSError:
        pass
print(json.dumps({'env': dict(os.environ), 'environ': readable}))
"""
    answers = await attacker.probe(code)
    assert CANARY_VARIABLE not in answers["env"]
    assert not any(CANARY in environ for environ in answers["environ"].values())
    sandbox._container.reload()  # the sandbox's container knows its id alone until it is reloaded
    docker_env = sandbox._container.attrs["Config"]["Env"] or []
    assert not any(CANARY in item for item in docker_env)
    await still_serves(attacker)


async def test_docker_socket(attacker):
    """Reaching the Docker Engine: its Unix sockets at the usual paths, its TCP ports on the gateway.

    No socket exists inside; TCP fails (no network).
    """
    code = r"""
import json, os, socket
answers = {path: os.path.lexists(path) for path in ('/var/run/docker.sock', '/run/docker.sock',
                                                     '/run/containerd/containerd.sock', '/var/run/docker')}
for host, port in (('172.17.0.1', 2375), ('172.17.0.1', 2376), ('127.0.0.1', 2375)):
    try:
        socket.create_connection((host, port), timeout=3).close()
        answers[f'{host}:{port}'] = 'connected'
    except OSError as error:
        answers[f'{host}:{port}'] = error.errno
print(json.dumps(answers))
"""
    answers = await attacker.probe(code)
    assert [answers[key] for key in list(answers)[:4]] == [False] * 4
    assert answers["172.17.0.1:2375"] == NO_ROUTE and answers["127.0.0.1:2375"] == errno.ECONNREFUSED
    await still_serves(attacker)


async def test_device_nodes(attacker):
    """Creating device nodes (a block device for the host disk, /dev/mem, a copy of /dev/null) in /tmp and the writable root.

    mknod is refused (no CAP_MKNOD); /dev holds only Docker's harmless default nodes. Under gVisor the block node may be made in /tmp (the Sentry's tmpfs), but opening it fails: no host device is behind it; /dev also holds gVisor's own net (tun) and fuse, which need privileges the command lacks.
    """
    result = await attacker.shell("mknod /tmp/disk b 8 0; mknod mem c 1 1; mknod null c 1 3; "
                                  f"mkfifo fifo && echo fifo-ok; {PYTHON} -c \"import os; print(*os.listdir('/dev'))\"")
    refusals = result.stderr.count("Operation not permitted")
    assert refusals == 3 or (GVISOR and refusals == 2 and "disk" not in result.stderr), result
    assert "fifo-ok" in result.stdout
    opened = await attacker.probe("import json\ntry:\n    open('/tmp/disk', 'rb').read(1)\n    print(0)\n"
                                  "except OSError as error:\n    print(error.errno)\n")
    assert opened != 0
    devices = set(result.stdout.split()) - {"fifo-ok"}
    assert devices <= {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm",
                       "stderr", "stdin", "stdout", "tty", "urandom", "zero"} | ({"net", "fuse"} if GVISOR else set())
    assert not (attacker.ws / "mem").exists() and not (attacker.ws / "null").exists()
    await still_serves(attacker)
