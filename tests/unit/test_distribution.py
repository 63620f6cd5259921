"""What `pip install protolink` puts into site-packages: the protolink package and the sandbox
server under a name of its own, never a top-level module with a generic name such as sandbox."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_only_protolink_and_its_sandbox_server(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("protolink-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"protolink", "protolink_sandboxd"}
    assert "protolink_sandboxd/__main__.py" in names and "protolink/wire/_pb/process_pb2.py" in names
