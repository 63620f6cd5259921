"""Real open-source projects with their own test suites, for proving the CI runner on code nobody
here wrote: :data:`PYTHON_PROJECTS` (and :data:`SPARE_PYTHON_PROJECTS`), :data:`JAVASCRIPT_PROJECTS`.

Each is a source distribution from its package index (PyPI, npm), pinned by version and sha256,
that holds its tests. :func:`fetch` downloads one into a host cache (``~/.cache/protolink/ci-sdists``,
kept between runs, checked by sha256 on every use) and :func:`unpack` makes a repository directory
of it (no ``.git``). In that directory the ``setup`` commands (shell, with the package index
reachable) install the project and its test tools, pinned, and ``test`` runs the suite offline and
writes :data:`JUNIT`. The same commands on the host and through the runner give the same totals:
:attr:`Project.expected`, measured on the host (Python 3.11).

npm never publishes a project's lockfile, so a JavaScript project's ``package-lock.json`` (its
development dependencies as resolved once, with their integrity hashes) is kept in
``tests/fixtures/ci`` and written into the repository by :func:`unpack`, for ``npm ci``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

#: Where downloaded source distributions are kept between runs.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "protolink" / "ci-sdists"
FILES = "https://files.pythonhosted.org/packages"
NPM = "https://registry.npmjs.org"
LOCKFILES = Path(__file__).parent / "fixtures" / "ci"
#: The JUnit file each test command writes, relative to the repository directory.
JUNIT = "junit.xml"
#: pytest and its dependencies, pinned so that the host's and the sandbox's runs match.
PYTEST = ("pytest==8.3.4", "iniconfig==2.0.0", "packaging==24.2", "pluggy==1.5.0")
DOWNLOAD_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Totals:
    """A JUnit report's totals: ``passed`` is the tests less the failed, errored and skipped."""

    passed: int
    failed: int
    errors: int
    skipped: int


@dataclass(frozen=True)
class Project:
    """A source distribution at ``url`` (``sha256``), the commands that set it up and test it, and
    the totals its tests give (the same on the host and through the runner)."""

    name: str
    version: str
    url: str
    sha256: str
    setup: tuple[str, ...]
    test: str
    expected: Totals
    #: A file of :data:`LOCKFILES` that :func:`unpack` writes as the repository's package-lock.json.
    lockfile: str | None = None

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[1]


def _python(name: str, version: str, path: str, sha256: str, tests: str, expected: Totals, *,
            test_deps: tuple[str, ...] = ()) -> Project:
    """A Python project tested with the pinned pytest (less the pin of the project itself)."""
    pins = [pin for pin in PYTEST if pin.split("==")[0] != name]
    return Project(
        name=name, version=version, url=f"{FILES}/{path}", sha256=sha256,
        setup=("python3 -m venv .venv",
               f".venv/bin/pip install --quiet {' '.join([*pins, *test_deps])} ."),
        test=f".venv/bin/python -m pytest -p no:cacheprovider -q --junitxml={JUNIT} {tests}",
        expected=expected,
    )


def _javascript(name: str, version: str, sha256: str, test: str, expected: Totals) -> Project:
    """An npm package installed by ``npm ci`` from the kept lockfile and tested by ``test``."""
    return Project(
        name=name, version=version, url=f"{NPM}/{name}/-/{name}-{version}.tgz", sha256=sha256,
        setup=("npm ci --ignore-scripts --no-audit --no-fund",), test=test, expected=expected,
        lockfile=f"{name}-{version}.package-lock.json",
    )


PYTHON_PROJECTS: tuple[Project, ...] = (
    _python("toolz", "1.2.0", "31/6f/ae20c212a07aa2d156c787383d8088a5e045ee39628661edb190c97e1659/toolz-1.2.0.tar.gz",
            "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "toolz/tests",
            Totals(passed=187, failed=0, errors=0, skipped=1)),
    _python("iniconfig", "2.3.1",
            "01/e1/2069291243c926a2ff1cd706c7f3eeb9b62144bf60f77c9fb9ff2fb26bd3/iniconfig-2.3.1.tar.gz",
            "67f4b9c50da0dedf52af349e7749a80a9057a5031199791b906c3bb3ae878960", "testing",
            Totals(passed=54, failed=0, errors=0, skipped=0)),
    _python("cachetools", "8.0.2",
            "75/28/eb1ac766e4c0c439506a654186de8e2cfcd99035218a9393986103a0fdf0/cachetools-8.0.2.tar.gz",
            "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "tests",
            Totals(passed=476, failed=0, errors=0, skipped=0)),
    _python("isodate", "0.7.2", "54/4d/e940025e2ce31a8ce1202635910747e5a87cc3a6a6bb2d00973375014749/isodate-0.7.2.tar.gz",
            "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "tests",
            Totals(passed=280, failed=0, errors=0, skipped=0)),
    # A C extension: the setup compiles it (build-essential, python3-dev).
    _python("markupsafe", "3.0.4",
            "38/9b/e422a865e1d5d57d0e509b4e0bf1c1a70a7f6382c29a5aa428df994c8bc8/markupsafe-3.0.4.tar.gz",
            "2e9ad7dd851bf45fab9f75cbff4cb493fee9979e8d8c7c9c3ee119022518edd6", "tests",
            Totals(passed=79, failed=0, errors=0, skipped=1)),
    _python("pluggy", "1.7.0", "bf/db/7fc19e6f2dc92a966727031389fc2e08b558f0f25eb7403c1119ad4713cd/pluggy-1.7.0.tar.gz",
            "d1eaa46ebb595891b860ab086b4d09c8588af65ebd4361b8e8f4bb8920b90ba8", "testing",
            Totals(passed=219, failed=0, errors=0, skipped=0)),
)

#: Checked the same way, for when one of the above stops fitting. (six 1.17.0 does not fit: which
#: of its tests skip follows the interpreter's optional modules, tkinter and dbm.gnu, so a host's
#: Python and the image's give different totals.)
SPARE_PYTHON_PROJECTS: tuple[Project, ...] = (
    _python("tabulate", "0.10.0",
            "46/58/8c37dea7bbf769b20d58e7ace7e5edfe65b849442b00ffcdd56be88697c6/tabulate-0.10.0.tar.gz",
            "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d", "test",
            Totals(passed=280, failed=0, errors=0, skipped=39)),
)

#: The project's own test runner, mocha, writes the JUnit file with its xunit reporter.
JAVASCRIPT_PROJECTS: tuple[Project, ...] = (
    _javascript("domhandler", "2.4.2", "834043152eb305bba5c9062bd3216e6956c935687e3dc645d44ca4e7ee1555f8",
                f"node_modules/.bin/mocha --reporter xunit --reporter-options output={JUNIT}",
                Totals(passed=25, failed=0, errors=0, skipped=0)),
)

ALL_PROJECTS = (*PYTHON_PROJECTS, *SPARE_PYTHON_PROJECTS, *JAVASCRIPT_PROJECTS)


def fetch(project: Project, cache: Path = CACHE) -> Path:
    """The project's source distribution in ``cache``, downloaded first unless a file with its
    sha256 is there. A download with another digest is discarded and raises ValueError."""
    path = cache / project.filename
    if path.is_file() and _sha256(path) == project.sha256:
        return path
    answer = httpx.get(project.url, follow_redirects=True, timeout=DOWNLOAD_TIMEOUT_SECONDS)
    answer.raise_for_status()
    digest = hashlib.sha256(answer.content).hexdigest()
    if digest != project.sha256:
        raise ValueError(f"{project.url} has sha256 {digest}, not {project.sha256}")
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f".{project.filename}.{os.getpid()}"
    part.write_bytes(answer.content)
    os.replace(part, path)
    return path


def unpack(project: Project, repository: Path, cache: Path = CACHE) -> Path:
    """Unpack the project's source distribution (fetched when needed) so that ``repository``, an
    empty or missing directory, is its top directory; returns ``repository``."""
    sdist = fetch(project, cache)
    repository.mkdir(parents=True, exist_ok=True)
    if any(repository.iterdir()):
        raise ValueError(f"{repository} is not empty")
    with tempfile.TemporaryDirectory(dir=repository.parent, prefix=".unpack-") as scratch:
        with tarfile.open(sdist) as archive:
            archive.extractall(scratch, filter="data")
        (top,) = Path(scratch).iterdir()
        for entry in top.iterdir():
            shutil.move(entry, repository / entry.name)
    if project.lockfile is not None:
        shutil.copyfile(LOCKFILES / project.lockfile, repository / "package-lock.json")
    return repository


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
