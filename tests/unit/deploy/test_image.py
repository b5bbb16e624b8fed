"""The Dockerfile, checked statically (no container engine here): pinned base, lock file, non-root."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from tests.unit.deploy.lockfile import LOCK_PATH, canonical, parse, runtime_requirements
from tests.unit.deploy.render import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}$")
Instruction = tuple[str, str]
# The layout `make image` (dra_devcluster/productimage.py) builds too.
VENV = "/opt/accel-dra"


def instructions() -> list[Instruction]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    result: list[Instruction] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        result.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return result


def stages() -> list[list[Instruction]]:
    """Instructions grouped per stage; stage 0 holds the global ARGs before the first FROM."""
    grouped: list[list[Instruction]] = [[]]
    for keyword, rest in instructions():
        if keyword == "FROM":
            grouped.append([])
        grouped[-1].append((keyword, rest))
    return grouped


def _global_args() -> dict[str, str]:
    found = {}
    for keyword, rest in stages()[0]:
        assert keyword == "ARG", f"{keyword} before the first FROM"
        name, _, default = rest.partition("=")
        found[name] = default.strip('"')
    return found


def test_every_base_image_is_pinned_by_version_and_digest() -> None:
    args = _global_args()
    names: set[str] = set()
    froms = [rest for stage in stages()[1:] for keyword, rest in stage if keyword == "FROM"]
    assert len(froms) >= 2, "expected a build stage and a runtime stage"
    for rest in froms:
        parts = rest.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
        if image not in names:
            assert PINNED_BASE.match(image), f"unpinned base image {image!r}"
        if len(parts) == 3 and parts[1].upper() == "AS":
            names.add(parts[2])


def test_runtime_stage_runs_as_non_root_by_default() -> None:
    final = stages()[-1]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the runtime stage never sets USER"
    uid, _, gid = users[-1].partition(":")
    # Numeric, or the kubelet cannot verify runAsNonRoot against it.
    assert uid == "65532"
    assert gid.isdigit()
    assert gid != "0"
    # The manifests choose the program with `command:`; an ENTRYPOINT would be prepended to it.
    assert not [rest for keyword, rest in final if keyword == "ENTRYPOINT"]


def test_runtime_dependencies_come_from_the_lock_file_only() -> None:
    final = stages()[-1]
    copied = [rest for keyword, rest in final if keyword == "COPY" and "requirements.lock" in rest]
    assert copied, "requirements.lock is not copied into the runtime stage"
    installs = []
    for keyword, rest in final:
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            words = shlex.split(command)
            if words[:2] in (["pip", "install"], [f"{VENV}/bin/pip", "install"]):
                installs.append(words[2:])
    assert installs, "the runtime stage installs nothing"
    for args in installs:
        assert "--no-deps" in args, f"pip install {args} may resolve unlocked versions"
        targets = [a for a in args if not a.startswith("-")]
        if "-r" in args:
            assert targets == ["/tmp/requirements.lock"]
        else:
            assert targets, f"pip install {args} installs nothing"
            assert all(t.endswith(".whl") for t in targets), f"pip install {args}"
    assert any("-r" in args for args in installs)
    assert any(a.endswith(".whl") for args in installs for a in args)


def test_build_tools_are_pinned() -> None:
    for stage in stages()[1:-1]:
        for keyword, rest in stage:
            if keyword == "RUN" and rest.startswith("pip install"):
                for target in [w for w in shlex.split(rest)[2:] if not w.startswith("-")]:
                    assert "==" in target, f"unpinned build tool {target!r}"


def test_console_scripts_used_by_the_manifests_exist() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    # compute-domain-daemon: the ComputeDomain DaemonSet's command and probe.
    assert {"dra-operator", "dra-node-agent", "compute-domain-daemon"} <= set(project["scripts"])


def test_dockerignore_lets_the_copied_sources_through() -> None:
    patterns = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    assert "**" in patterns, "everything not listed should stay out of the build context"
    for stage in stages()[1:]:
        for keyword, rest in stage:
            if keyword == "COPY" and "--from=" not in rest:
                for source in rest.split()[:-1]:
                    assert source.rstrip("/") in included, f"COPY {source} is excluded by .dockerignore"


def test_lock_file_pins_every_runtime_dependency() -> None:
    pins = parse(LOCK_PATH.read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonical(requirement.name)
        assert name in pins, f"{name} (pyproject dependency) is missing from requirements.lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject's {requirement.specifier}"
        )
    test_only = {canonical(r) for r in ("pytest", "mypy", "ruff", "tox", "grpcio-tools")}
    assert not test_only & set(pins), "development tools do not belong in the image"


def test_lock_file_is_closed_under_dependencies() -> None:
    # Read through the environment's metadata. Versions there may be newer than the lock's (tox builds
    # a fresh environment); dependency names rarely change between versions, version ranges may, so
    # ranges are only checked where the installed version is the locked one.
    pins = parse(LOCK_PATH.read_text())
    for name, version in pins.items():
        dist = metadata.distribution(name)
        for requirement in runtime_requirements(dist):
            dep = canonical(requirement.name)
            assert dep in pins, f"{name} needs {requirement}, which requirements.lock lacks"
            if dist.version == version:
                assert requirement.specifier.contains(pins[dep], prereleases=True), (
                    f"{name}=={version} needs {requirement}; requirements.lock has {dep}=={pins[dep]}"
                )


def test_runtime_stage_matches_the_image_built_without_docker() -> None:
    from dra_devcluster import productimage

    final = stages()[-1]
    assert productimage.VENV == VENV
    envs = " ".join(rest for keyword, rest in final if keyword == "ENV")
    path = re.search(r"PATH=(\S+)", envs)
    assert path, "the runtime stage sets no PATH"
    assert path.group(1).split(":")[0] == f"{VENV}/bin"
    assert "PYTHONDONTWRITEBYTECODE=1" in envs
    assert [rest for keyword, rest in final if keyword == "CMD"] == [
        json.dumps(list(productimage.DEFAULT_CMD))
    ]
    assert f"{productimage.USER_ID}:{productimage.USER_ID}" in [r for k, r in final if k == "USER"]
    args = dict(rest.partition("=")[::2] for keyword, rest in final if keyword == "ARG")
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert args["VERSION"] == version, "the Dockerfile's VERSION default lags pyproject.toml"
    labels = " ".join(rest for keyword, rest in final if keyword == "LABEL")
    for label in ("version", "revision", "created"):
        assert f"org.opencontainers.image.{label}=" in labels
    # The project has no public URL; a source label would name whatever folder the image was built in.
    assert "org.opencontainers.image.source" not in labels
