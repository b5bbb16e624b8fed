"""The machine check that make and .ci/run run before any build: one line per unmet prerequisite,
the missing Debian packages installed only as root with apt-get, no traceback, old Pythons told so."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from dra_devcluster import prerequisites
from dra_devcluster.prerequisites import Package, Unmet, ensure_packages

SCRIPT = Path(prerequisites.__file__)
_A = Package("pkg-a", frozenset({"demo", "test"}), proofs=("tool-a",))
_B = Package("pkg-b", frozenset({"test"}), proofs=("/nonexistent/tool-b",))
_C = Package("pkg-c", frozenset({"image"}), proofs=("tool-c",))


def test_the_go_directive_is_read_from_the_go_mod() -> None:
    assert prerequisites.go_directive("module x\n\ngo 1.26.0\n\nrequire (\n)\n") == (1, 26, 0)
    assert prerequisites.go_directive("module x\ngo 1.22\ntoolchain go1.23.4\n") == (1, 22, 0)
    assert prerequisites.go_needed() >= (1, 26, 0)
    # Every version's module, containerd's and helm's.
    assert {path.parent.name for path in prerequisites.GO_MODS} >= {"containerd", "helm", "k8s-1.36"}
    with pytest.raises(ValueError, match="no go directive"):
        prerequisites.go_directive("module x\n")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("go1.26.8", (1, 26, 8)),
        ("go1.26", (1, 26, 0)),
        ("devel go1.27-abc123 Tue", (1, 27, 0)),
        ("junk", None),
    ],
)
def test_go_version_strings(text: str, version: tuple[int, int, int] | None) -> None:
    assert prerequisites.parse_go_version(text) == version


def test_go_must_be_there_and_new_enough() -> None:
    prerequisites.check_go(needed=(1, 26, 0), found="go1.26.0")
    prerequisites.check_go(needed=(1, 26, 0), found="go1.27.1")
    with pytest.raises(Unmet, match=r"^Go 1\.25\.9 is too old: .* install Go 1\.26\.0 or newer$"):
        prerequisites.check_go(needed=(1, 26, 0), found="go1.25.9")
    with pytest.raises(Unmet, match=r"^no `go` on PATH: .* install Go 1\.26\.0 or newer$"):
        prerequisites.check_go(needed=(1, 26, 0), found=None)


def test_python_version() -> None:
    prerequisites.check_python((3, 11, 0))
    with pytest.raises(Unmet, match=r"^Python 3\.10\.4 is too old: .*with PYTHON=python3\.11\)$"):
        prerequisites.check_python((3, 10, 4))


def test_root_is_needed() -> None:
    prerequisites.check_root("demo", euid=0)
    with pytest.raises(Unmet, match=r"^mmdebstrap .* needs root; run it as root$"):
        prerequisites.check_root("image", euid=1000)


def test_disk_for_the_first_build(tmp_path: Path) -> None:
    base = tmp_path / "not-yet" / "cache"
    prerequisites.check_disk(base=base, free_bytes=lambda _: 6 * 2**30)
    with pytest.raises(Unmet, match=rf"^only 2\.0 GiB free at {tmp_path}: the first build needs about 5\.5"):
        prerequisites.check_disk(base=base, free_bytes=lambda _: 2 * 2**30)
    # Once the binaries are built, the check is skipped.
    for binary in ("control-plane/v1/bin/kube-apiserver", "node/v1/bin/kubelet"):
        (base / "accel-dra" / binary).parent.mkdir(parents=True)
        (base / "accel-dra" / binary).touch()
    prerequisites.check_disk(base=base, free_bytes=lambda _: 0)


def test_cache_base_follows_the_environment(tmp_path: Path) -> None:
    assert prerequisites.cache_base({"XDG_CACHE_HOME": "/x"}) == Path("/x")
    assert prerequisites.cache_base({"XDG_CACHE_HOME": "/x", "DRA_CONTROL_PLANE_CACHE": "/y"}) == Path("/y")
    assert prerequisites.cache_base({"XDG_CACHE_HOME": ""}) == Path.home() / ".cache"


def test_locate_tries_files_commands_and_modules(tmp_path: Path) -> None:
    tool = tmp_path / "tool-a"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert prerequisites.locate(_A, path=str(tmp_path)) == str(tool)
    assert prerequisites.locate(_A, path=str(tmp_path / "empty")) is None
    assert prerequisites.locate(Package("x", frozenset(), proofs=(str(tool),))) == str(tool)
    assert prerequisites.locate(Package("x", frozenset(), modules=("json",))) == "json"
    assert prerequisites.locate(Package("x", frozenset(), modules=("no_such_module_here",))) is None


class _Apt:
    def __init__(self, *, installs: bool = True) -> None:
        self.installed: set[str] = set()
        self.calls: list[list[str]] = []
        self.installs = installs

    def find(self, package: Package) -> str | None:
        return "/found" if package.name in self.installed else None

    def __call__(self, apt_get: str, names: Sequence[str]) -> None:
        self.calls.append([apt_get, *names])
        if self.installs:
            self.installed.update(names)


def _ensure(
    apt: _Apt,
    purpose: str = "test",
    *,
    install: bool = True,
    is_root: bool = True,
    apt_get: str | None = "/usr/bin/apt-get",
) -> list[str]:
    return ensure_packages(
        purpose,
        install=install,
        is_root=is_root,
        apt_get=apt_get,
        packages=(_A, _B, _C),
        find=apt.find,
        apt=apt,
    )


def test_missing_packages_are_installed_as_root_with_apt(capsys: pytest.CaptureFixture[str]) -> None:
    apt = _Apt()
    assert _ensure(apt) == ["pkg-a", "pkg-b"]
    assert apt.calls == [["/usr/bin/apt-get", "pkg-a", "pkg-b"]]
    assert capsys.readouterr().err == "installing the missing Debian packages: pkg-a pkg-b\n"
    assert _ensure(apt) == []  # present now: nothing to do
    assert len(apt.calls) == 1


@pytest.mark.parametrize(
    ("install", "is_root", "apt_get"),
    [(True, False, "/usr/bin/apt-get"), (True, True, None), (False, True, "/usr/bin/apt-get")],
    ids=["not root", "no apt", "no-install"],
)
def test_otherwise_one_line_names_them_and_the_command(
    install: bool, is_root: bool, apt_get: str | None
) -> None:
    apt = _Apt()
    with pytest.raises(Unmet) as raised:
        _ensure(apt, "demo", install=install, is_root=is_root, apt_get=apt_get)
    assert str(raised.value) == "missing Debian packages: pkg-a; install them with: apt-get install pkg-a"
    assert apt.calls == []


def test_still_missing_after_apt_is_one_line() -> None:
    with pytest.raises(Unmet, match=r"^apt-get installed them, but this still finds no tool-a \(pkg-a\)$"):
        _ensure(_Apt(installs=False), "demo")


def test_apt_failure_is_its_last_error_line(tmp_path: Path) -> None:
    apt_get = tmp_path / "apt-get"
    apt_get.write_text(
        "#!/bin/sh\necho 'Reading package lists...'\necho 'E: Unable to locate package pkg-a' >&2\nexit 100\n"
    )
    apt_get.chmod(0o755)
    with pytest.raises(
        Unmet, match=r"^apt-get update failed \(exit 100\): E: Unable to locate package pkg-a$"
    ):
        prerequisites.apt_install(str(apt_get), ["pkg-a"])


def test_the_table_serves_every_purpose() -> None:
    names = {
        purpose: [p.name for p in prerequisites.PACKAGES if purpose in p.purposes]
        for purpose in prerequisites.PURPOSES
    }
    assert {"runc", "containernetworking-plugins", "busybox-static"} <= set(names["demo"])
    assert {"prometheus", "mmdebstrap", *names["demo"], *names["image"]} <= set(names["test"])
    assert "mmdebstrap" in names["image"]


def test_the_script_parses_on_old_pythons() -> None:
    # To say "Python 3.9 is too old" the file must at least parse there.
    source = SCRIPT.read_text()
    for minor in (7, 8, 9, 10):
        ast.parse(source, feature_version=(3, minor))


@pytest.mark.parametrize("purpose", ["image", "demo"])
def test_the_script_runs_on_the_standard_library_alone(purpose: str) -> None:
    # -I -S: no site-packages, so nothing of the project or its dependencies can be imported.
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), purpose, "--no-install"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1), result.stderr
    assert len(result.stderr.splitlines()) == result.returncode, result.stderr
    assert result.stderr.startswith(f"make {purpose}: ") or not result.stderr
    listed = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), purpose, "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "make" in listed.stdout.split()
