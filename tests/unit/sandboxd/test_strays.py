"""Which processes are strays: those of the command uid that no longer descend from the server
(whatever their group or session), and where subreapers are refused, those whose every
possible command has ended."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from protolink_sandboxd.strays import Origins, _Process

from .test_stray_look import ROOT

pytestmark = pytest.mark.root

UID = 65533
SPAWNER, KEEPER, OTHER_KEEPER = 10, 11, 12


def look(*processes: tuple[int, int, int]) -> dict[int, _Process]:
    """A look at /proc made of (pid, parent, uid) triples, above a server (2) and its spawner."""
    found = {1: _Process(1, 0, frozenset({0})), 2: _Process(2, 1, frozenset({0})),
             SPAWNER: _Process(SPAWNER, 2, frozenset({UID, 65534}))}
    found.update((pid, _Process(pid, parent, frozenset({uid}))) for pid, parent, uid in processes)
    return found


def test_a_process_seen_below_a_keeper_is_spared_while_that_keeper_lives():
    origins = Origins(UID, lambda: SPAWNER)
    origins.update(look((KEEPER, SPAWNER, UID), (OTHER_KEEPER, SPAWNER, UID), (20, KEEPER, UID)))
    origins.update(look((KEEPER, SPAWNER, UID), (OTHER_KEEPER, SPAWNER, UID), (20, 1, UID)))  # orphaned
    assert origins.spares(20)
    origins.update(look((OTHER_KEEPER, SPAWNER, UID), (20, 1, UID)))  # its command has ended
    assert not origins.spares(20)


def test_a_process_first_seen_orphaned_lives_until_every_command_running_then_has_ended():
    origins = Origins(UID, lambda: SPAWNER)
    origins.update(look((KEEPER, SPAWNER, UID), (OTHER_KEEPER, SPAWNER, UID), (20, 1, UID)))
    assert origins.spares(20)
    origins.update(look((OTHER_KEEPER, SPAWNER, UID), (13, SPAWNER, UID), (20, 1, UID)))
    assert origins.spares(20)  # one of them still runs
    origins.update(look((13, SPAWNER, UID), (20, 1, UID)))
    assert not origins.spares(20)  # a command started later is not its origin


def test_with_no_command_running_nothing_outside_is_spared():
    origins = Origins(UID, lambda: SPAWNER)
    origins.update(look((20, 1, UID)))
    assert not origins.spares(20)
    origins.update(look((KEEPER, SPAWNER, UID), (20, 1, UID)))
    assert not origins.spares(20)  # already known to come from no running command


def test_strays_are_what_left_the_servers_tree_whatever_their_session():
    """In a pid namespace of its own, under an init that is not this process (as in the
    container): a process of the uid below this process lives though it leads its own session;
    one orphaned to init is dead when the sweep returns, though it is slow to die (it may only
    run when a busy CPU has nothing else to run)."""
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from protolink_sandboxd.strays import kill_strays

        def dead(pid):
            try:
                return "State:\tZ" in open(f"/proc/{{pid}}/status").read()
            except (FileNotFoundError, ProcessLookupError):  # reaped meanwhile
                return True

        below = subprocess.Popen(["setsid", "sleep", "60"], user={UID})
        orphan = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"], user={UID},
                                capture_output=True, text=True, check=True)
        outside = int(orphan.stdout)
        while open(f"/proc/{{outside}}/stat").read().rsplit(")", 1)[1].split()[1] != "1":
            time.sleep(0.01)  # until it has been reparented
        *others, busy = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, others or [busy])
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(hog.pid, [busy])
        os.sched_setaffinity(outside, [busy])
        os.sched_setscheduler(outside, os.SCHED_IDLE, os.sched_param(0))  # waits for the hog's slice
        try:
            assert kill_strays({UID}, os.getpid()) == 1, "one stray"
            assert dead(outside), "the stray still runs"
        finally:
            hog.kill()
        assert below.poll() is None, "the process below lives"
        assert kill_strays({UID}, None) == 1, "at shutdown, every process of the uid"
        assert below.wait() == -9
        print("ok")
    """)
    init = ["sh", "-c", '"$@" & wait', "init", sys.executable, "-c", script]
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *init],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
