"""Library or user code (probes/tools/frames.py), decided by where a module was imported from
(issue 45): a package installed with ``pip install --target`` and put on PYTHONPATH is a
library's, though no "site-packages" is in its path (textual so installed on the GPU box made
two culprit tests blame it); a folder of the user's own on PYTHONPATH stays the user's. Each
check runs in a fresh interpreter whose PYTHONPATH holds the folders, as the GPU box's did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from factories import ROOT, run_python, subprocess_env

CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import {pkg} as pkg, userpkg
from probes.tools.frames import allocating_user_frame, is_stdlib_file, is_user_file
user = userpkg.__file__
print(json.dumps({{
    "pkg_is_user": is_user_file(pkg.__file__),
    "userpkg_is_user": is_user_file(user),
    "script_is_user": is_user_file(sys.argv[2]),
    "json_is_user": is_user_file(json.__file__),
    "json_is_stdlib": is_stdlib_file(json.__file__),
    "pkg_is_stdlib": is_stdlib_file(pkg.__file__),
    "blamed_through_pkg": allocating_user_frame([(pkg.__file__, 2), (user, 1)]),
    "blamed_through_json": allocating_user_frame([(json.__file__, 2), (user, 1)]),
}}))
"""


def _user_package(tmp_path: Path) -> Path:
    """A folder of the user's own sources on PYTHONPATH: no distribution installed there."""
    src = tmp_path / "src"
    (src / "userpkg").mkdir(parents=True, exist_ok=True)
    (src / "userpkg" / "__init__.py").write_text("def make():\n    return [0] * 10\n")
    return src


def _check(tmp_path: Path, pkg: str, target: Path) -> dict:
    src = _user_package(tmp_path)
    script = src / "train.py"
    script.write_text("print('a user script')\n")
    env = subprocess_env(PYTHONPATH=f"{target}:{src}")
    res = subprocess.run([sys.executable, "-c", CHECK.format(pkg=pkg), str(ROOT), str(script)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _assert_rule(got: dict) -> None:
    assert got["pkg_is_user"] is False and got["pkg_is_stdlib"] is False
    assert got["userpkg_is_user"] is True and got["script_is_user"] is True
    assert got["json_is_user"] is False and got["json_is_stdlib"] is True
    assert got["blamed_through_pkg"] is None  # a package's allocation is not the user's line
    assert got["blamed_through_json"] is not None  # the standard library may lie between


def test_a_package_folder_pip_would_write_on_pythonpath_is_a_library(tmp_path):
    """The layout ``pip install --target T`` leaves (the package beside its .dist-info),
    made by hand: no "site-packages" in the path, still a library."""
    target = tmp_path / "target"
    (target / "tinypkg").mkdir(parents=True)
    (target / "tinypkg" / "__init__.py").write_text("def make():\n    return [0] * 10\n")
    info = target / "tinypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n")
    _assert_rule(_check(tmp_path, "tinypkg", target))
    # the same package without its .dist-info is a folder of sources on PYTHONPATH: the user's
    (target / "tinypkg-0.1.dist-info" / "METADATA").unlink()
    info.rmdir()
    assert _check(tmp_path, "tinypkg", target)["pkg_is_user"] is True


@pytest.mark.slow  # pip builds and installs a package (offline, ~5-15 s on two cores)
def test_a_package_installed_with_pip_install_target_is_a_library(tmp_path):
    project = tmp_path / "proj"
    (project / "tinypkg").mkdir(parents=True)
    (project / "tinypkg" / "__init__.py").write_text("def make():\n    return [0] * 10\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "0.1"\n')
    target = tmp_path / "target"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                          "--no-build-isolation", "--target", str(target), str(project)],
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    if res.returncode != 0 and "setuptools" in res.stderr:
        pytest.skip(f"no setuptools to build with offline: {res.stderr[-200:]}")
    assert res.returncode == 0, res.stderr
    assert any(p.name.endswith(".dist-info") for p in target.iterdir())
    _assert_rule(_check(tmp_path, "tinypkg", target))


def test_installed_packages_and_memtop_are_not_user_code_here():
    res = run_python(
        "import json, textual, torch\n"
        "from probes.tools.frames import is_user_file, library_roots\n"
        "import probes.monitor.monitor as m\n"
        "print(json.dumps([is_user_file(textual.__file__), is_user_file(torch.__file__),\n"
        "                  is_user_file(m.__file__), is_user_file('<frozen os>'),\n"
        "                  all(r.endswith('/') for r in library_roots())]))\n")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [False, False, False, False, True]
