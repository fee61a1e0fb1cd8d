"""kubeseer installed, not cloned: a wheel built from the tree, installed into a fresh virtualenv,
run from a directory outside the checkout.

The virtualenv holds kubeseer from the wheel and nothing else of the checkout; it borrows the
third-party dependencies (torch, onnx, kopf, ...) from the development virtualenv through a
``.pth`` line, since installing torch again would take minutes and gigabytes without testing
anything of kubeseer's. The wheel must carry deploy/, examples/ and hack/ as package data, equal
to the tree's, and the CLI must find them there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from kubeseer import resources
from kubeseer.devcluster import binaries, errors

pytestmark = pytest.mark.slow

CHECKOUT = resources.CHECKOUT


def tree_files() -> list[str]:
    """The checkout's files as a fresh clone would have them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=CHECKOUT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (CHECKOUT / name).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with kubeseer installed from a wheel of the tree; its bin directory."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    archive = root / "source.tar"
    with tarfile.open(archive, "w") as tar:  # a copy, so the build writes nothing in the tree
        for name in tree_files():
            tar.add(CHECKOUT / name, arcname=name)
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    wheels = root / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            f"{source}/",  # a path: "source" alone would name a project on PyPI
        ],
        check=True,
    )
    (wheel,) = wheels.glob("kubeseer-*.whl")
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
    )
    return env / "bin"


def run(bin_dir: Path, *argv: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        cwd=cwd,
        env={**environ, "PATH": f"{bin_dir}:{environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_installed_package_is_the_wheel_and_reads_its_own_package_data(installed, tmp_path):
    found = run(
        installed,
        "python",
        "-c",
        "import kubeseer, kubeseer.resources as r; print(kubeseer.__file__); print(r.root())",
        cwd=tmp_path,
    )
    assert found.returncode == 0, found.stderr
    module, root = (Path(line) for line in found.stdout.split())
    assert installed.parent in module.parents and CHECKOUT not in module.parents
    assert root == module.parent / "_data"


def test_the_wheel_carries_deploy_examples_and_hack_equal_to_the_tree(installed):
    data = next(installed.parent.glob("lib/python*/site-packages/kubeseer/_data"))
    shipped = [name for name in tree_files() if name.split("/", 1)[0] in resources.SHIPPED]
    assert any(name.startswith("deploy/crds/") for name in shipped)
    for name in shipped:
        assert (data / name).read_bytes() == (CHECKOUT / name).read_bytes(), name
    copied = {
        str(path.relative_to(data))
        for path in data.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert copied == set(shipped)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["demo", "--help"], ["devcluster", "up", "--help"], ["operator", "run", "--help"]],
)
def test_the_cli_runs_outside_the_checkout(installed, tmp_path, argv):
    done = run(installed, "kubeseer", *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: kubeseer" in done.stdout


def test_a_prediction_uses_the_shipped_checkpoint(installed, tmp_path):
    light = Path(__import__("onnx").__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    if not light.exists():
        pytest.skip("this onnx wheel ships no light test models")
    done = run(installed, "kubeseer", "predict", str(light), "--batch", "8", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"batch_size": 8' in done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e
def test_devcluster_up_and_operator_run_work_from_the_installed_package(installed, tmp_path):
    """`devcluster up` applies the wheel's CRD and RBAC and finds the pinned binaries through
    the wheel's hack/versions.env; `operator run` serves that cluster until stopped."""
    try:
        binaries.locate()
    except errors.BinariesMissingError as e:
        pytest.skip(str(e))
    run_dir = tmp_path / "cluster"
    up = run(installed, "kubeseer", "devcluster", "up", "--dir", str(run_dir), cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        operator_kubeconfig = next(
            line.split(": ", 1)[1]
            for line in up.stdout.splitlines()
            if line.startswith("operator kubeconfig:")
        )
        health = free_port()
        log = (tmp_path / "operator.log").open("w")
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        environ.update(
            KUBESEER_HEALTH_PORT=str(health),
            KUBESEER_METRICS_PORT=str(free_port()),
            PATH=f"{installed}:{environ['PATH']}",
        )
        operator = subprocess.Popen(
            [str(installed / "kubeseer"), "operator", "run", "--kubeconfig", operator_kubeconfig],
            cwd=tmp_path,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                assert operator.poll() is None, (tmp_path / "operator.log").read_text()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2):
                        break
                except OSError:
                    assert time.monotonic() < deadline, (tmp_path / "operator.log").read_text()
                    time.sleep(1)
        finally:
            # Only that it ran is this test's business; how fast kopf stops is the operator's.
            operator.kill()
            operator.wait(30)
            log.close()
    finally:
        down = run(installed, "kubeseer", "devcluster", "down", "--dir", str(run_dir), cwd=tmp_path)
        assert down.returncode == 0 or not run_dir.exists(), down.stderr
        shutil.rmtree(run_dir, ignore_errors=True)
