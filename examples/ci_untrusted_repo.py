"""Run an untrusted repository's tests in a sandbox with the CI runner, offline.

Needs a Docker Engine and the sandbox image (built here when missing, which takes minutes the
first time)::

    python examples/ci_untrusted_repo.py

The example writes a small repository: a module, its unittest suite (one test fails on purpose),
a script that writes the results as JUnit XML, and a test that behaves like a hostile pull
request: it looks for the host's secrets, writes outside its workspace and tries the network.
The runner copies the repository into a fresh workspace, runs the setup command and the tests in
a sandbox without network, collects the JUnit file and the coverage artifact, and removes
everything. Real projects use the CI image (``image="ci"``, the default: compilers, Node.js) and
``allow=["pypi.org", "files.pythonhosted.org"]`` for their setup's ``pip install``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import textwrap
from pathlib import Path

from protolink.sandbox.ci import CiJob, run_job
from protolink.sandbox.provision import ensure_image

FILES = {
    "calc.py": """
        def add(a, b):
            return a + b


        def divide(a, b):
            return a / b
    """,
    "test_calc.py": """
        import unittest

        import calc


        class CalcTest(unittest.TestCase):
            def test_add(self):
                self.assertEqual(calc.add(2, 3), 5)

            def test_divide(self):
                self.assertEqual(calc.divide(1, 0), 0)  # fails: ZeroDivisionError

            @unittest.skip("needs a GPU")
            def test_gpu(self):
                pass
    """,
    "test_hostile.py": """
        import os
        import socket
        import unittest


        class Hostile(unittest.TestCase):
            def test_secrets_are_not_here(self):
                self.assertNotIn("AWS_SECRET_ACCESS_KEY", os.environ)

            def test_outside_the_workspace_is_read_only(self):
                for path in ("/etc/cron.d/backdoor", "/usr/local/bin/evil", os.environ["HOST_CHECKOUT"] + "/planted"):
                    with self.assertRaises(OSError):
                        open(path, "w")

            def test_there_is_no_network(self):
                with self.assertRaises(OSError):
                    socket.create_connection(("1.1.1.1", 443), timeout=3)
    """,
    "run_tests.py": """
        import sys
        import unittest
        import xml.etree.ElementTree as ET

        result = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.discover("."))
        suite = ET.Element("testsuite", name="unittest", tests=str(result.testsRun))
        problems = {test.id(): ("failure", text) for test, text in result.failures}
        problems |= {test.id(): ("error", text) for test, text in result.errors}
        skipped = {test.id() for test, _ in result.skipped}
        for test in unittest.defaultTestLoader.discover("."):
            for case in (c for group in test for c in group):
                element = ET.SubElement(suite, "testcase", name=case.id())
                if case.id() in problems:
                    kind, text = problems[case.id()]
                    ET.SubElement(element, kind).text = text
                elif case.id() in skipped:
                    ET.SubElement(element, "skipped")
        ET.ElementTree(suite).write("junit.xml")
        open("coverage.txt", "w").write("calc.py 100%\\n")
        sys.exit(not result.wasSuccessful())
    """,
}


def write_repository(path: Path) -> None:
    path.mkdir()
    for name, text in FILES.items():
        (path / name).write_text(textwrap.dedent(text).lstrip())


async def main() -> None:
    image = await asyncio.to_thread(ensure_image)
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "pull-request"
        write_repository(repo)
        os.environ["AWS_SECRET_ACCESS_KEY"] = "never-leaves-this-host"  # a host secret: not passed in
        os.environ["HOST_CHECKOUT"] = str(repo)
        job = CiJob(repo=str(repo), image=image, setup=["python3 -c 'import calc'"],
                    test=["python3", "run_tests.py"], env=["HOST_CHECKOUT"],
                    junit=["junit.xml"], artifacts=["coverage.txt"], timeout_seconds=300)
        report = await run_job(job, artifacts_dir=Path(scratch) / "out", report_path=Path(scratch) / "report.json")
        data = report.to_dict()
        totals = data["junit"]["totals"]
        print(f"outcome: {data['outcome']} (exit {data['exit_code']})")
        print(f"tests: {totals['tests']} run, {totals['passed']} passed, {totals['failures']} failed, "
              f"{totals['errors']} errors, {totals['skipped']} skipped")
        for phase in data["phases"]:
            for command in phase["commands"]:
                print(f"{phase['name']} (network: {phase['network']}): {' '.join(command['argv'])} "
                      f"-> exit {command['exit_code']}")
        print(f"artifacts: {[item['path'] for item in data['artifacts']['files']]}")
        print(f"planted file in the checkout: {'present' if (repo / 'planted').exists() else 'absent'}")
        print(f"secret in the report: {'yes' if 'never-leaves-this-host' in str(data) else 'no'}")
        print(f"peak memory: {data['resources']['memory_peak_bytes'] >> 20} MiB, "
              f"peak tasks: {data['resources']['pids_peak']}")
        hostile = [line for line in data["phases"][-1]["commands"][0]["output_tail"].splitlines()
                   if "Hostile" in line]
        print("hostile tests:", *hostile, sep="\n  ")


if __name__ == "__main__":
    asyncio.run(main())
