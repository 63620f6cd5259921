"""Getting a machine ready for sandboxes: a Docker Engine that answers, and the image to run.

Both run the project's scripts (``scripts/engine-up.sh``, ``scripts/build-images.sh``), the same
ones ``.ci/run``, ``make image`` and ``make ci-image`` use, so there is one bootstrap and one image
recipe. They are blocking and stream the scripts' progress; call them through ``asyncio.to_thread``
from async code.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from protolink.errors import SandboxError

from .images import BUILT_IMAGES, DEFAULT_IMAGE, built_kind, image_reference, missing_image_hint

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_script(name: str, progress: Progress, *args: str) -> list[str]:
    """Run ``scripts/NAME ARGS``, streaming its lines to ``progress``; the last lines it printed."""
    script = SCRIPTS / name
    if not script.is_file():
        raise SandboxError(f"{script} is missing: run this from a protolink checkout")
    with subprocess.Popen(["bash", str(script), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace") as process:
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            line = line.rstrip("\n")
            progress(line)
            tail = [*tail[-19:], line]
    if process.returncode != 0:
        raise SandboxError(f"{name} failed (exit {process.returncode}):\n" + "\n".join(tail))
    return tail


def engine_answers() -> bool:
    """True when the Docker Engine of the environment (``DOCKER_HOST``) answers a ping."""
    import docker

    try:
        client = docker.from_env(timeout=5)
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except docker.errors.DockerException:
        return False
    finally:
        client.close()


def ensure_engine(progress: Progress = _stderr) -> None:
    """Make a Docker Engine answer (``scripts/engine-up.sh``: on Debian as root it installs and
    starts one; elsewhere it says exactly what is missing, raised here as SandboxError)."""
    if not engine_answers():
        _run_script("engine-up.sh", progress)


def image_exists(image: str) -> bool:
    import docker

    client = docker.from_env()
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()


def ensure_image(image: str = DEFAULT_IMAGE, progress: Progress = _stderr) -> str:
    """The image to run, built first when needed, and returned.

    For an image the project builds (:data:`BUILT_IMAGES`: ``sandbox``, the default, or ``ci``,
    by that name or its ``:latest`` tag) in a checkout, ``scripts/build-images.sh KIND`` runs
    every time: it is incremental (an image whose inputs did not change is not rebuilt), so the
    image always holds the checkout's code; the tag it reports (``protolink/KIND:<inputs hash>``)
    is returned, which another checkout's build cannot retag. Any other image, or an
    installation without the scripts, must already exist.
    """
    kind = built_kind(image)
    if kind is not None and (SCRIPTS / "build-images.sh").is_file():
        marker = f"{kind} image: "
        built = [line.rsplit(marker, 1)[1].strip() for line in _run_script("build-images.sh", progress, kind)
                 if marker in line]
        return built[-1] if built else BUILT_IMAGES[kind][0]
    image = image_reference(image)
    if not image_exists(image):
        raise SandboxError(f"the sandbox image {image} does not exist: {missing_image_hint(image)}")
    return image
