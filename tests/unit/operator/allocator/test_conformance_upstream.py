"""Every case of the allocator case file, run through upstream's allocator.

``bench/go_allocator -conformance`` (built here, once per version of its sources, from
``k8s.io/dynamic-resource-allocation`` at the default control plane's release) reads the same YAML,
runs each case with its feature gates through the variant ``NewAllocator`` picks for them (as
kube-scheduler does) and through every other variant the case lists, and says per case and variant
whether upstream's outcome is the one the case expects; the same for the project's own cases
(``project-cases.yaml``). ``test_conformance.py`` holds our allocator to the same cases, so both
agree through the files. Needs Go, which CI always has: without it the
build fails, and so does this module, with the reason.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import gobuild

from . import conformance_loader as cl

CASES = cl.load_cases()
FILES = {
    "upstream": (cl.CASES_FILE, CASES),
    "project": (cl.PROJECT_CASES_FILE, cl.load_cases(cl.PROJECT_CASES_FILE)),
}


@pytest.fixture(scope="module")
def go_allocator() -> Path:
    binary, _ = gobuild.build("go_allocator")
    return binary


def _run(binary: Path, cases_file: Path) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        [str(binary), "-conformance", str(cases_file), "-json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    # 0: all agree; 1: some disagree (listed on stdout); anything else: it could not run.
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module", params=sorted(FILES))
def verdicts(
    request: pytest.FixtureRequest, go_allocator: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the file's cases, upstream's verdicts on them) for the upstream and the project's file."""
    path, cases = FILES[request.param]
    _, found = _run(go_allocator, path)
    return cases, found


def test_every_case_agrees_with_upstream(verdicts: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    disagree = [v for v in verdicts[1] if not v["agree"]]
    assert not disagree, "\n".join(
        f"{v['case']} ({v['variant']}): {v['why']}; upstream: {json.dumps(v.get('upstream'))}"
        for v in disagree
    )


def test_every_case_ran_on_every_variant_it_lists(
    verdicts: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    cases, found = verdicts
    ran = sorted((v["case"], v["variant"]) for v in found)
    assert ran == sorted((c["name"], variant) for c in cases for variant in c["upstreamVariants"])
    # NewAllocator takes the first variant (stable, incubating, experimental) whose features cover
    # the case's gates: the first one the case lists, if the list is right.
    scheduler = {v["case"]: v["variant"] for v in found if v["scheduler"]}
    assert scheduler == {c["name"]: c["upstreamVariants"][0] for c in cases}


def _case(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(c for c in CASES if c["name"] == name))


def _wrong_expectations() -> dict[str, dict[str, Any]]:
    """Cases of the file with one expectation made wrong, by the text the tool must answer with."""
    device = _case("several-different-drivers")
    device["expect"]["results"][0]["devices"][0]["device"] = "device-9"
    outcome = _case("other-node")
    outcome["expect"] = {"outcome": "unallocatable"}
    error = _case("invalid-CEL-one-device")
    error["expect"]["errorContains"] = "some other text"
    selector = _case("other-node")
    selector["expect"]["results"][0]["nodeSelector"] = None
    effort = _case("check-combinations-within-single-request-many-pools")
    effort["allocateOneInvocations"] = {k: n + 1 for k, n in effort["allocateOneInvocations"].items()}
    return {
        "expected device #0": device,
        "upstream allocated, the case expects unallocatable": outcome,
        'error text lacks "some other text"': error,
        "node selector": selector,
        "allocateOneInvocations": effort,
    }


def test_a_wrong_expectation_is_reported(go_allocator: Path, tmp_path: Path) -> None:
    wrong = _wrong_expectations()
    for why, case in wrong.items():
        case["name"] = f"{case['name']} ({why})"
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump({"cases": list(wrong.values())}))
    returncode, found = _run(go_allocator, path)
    assert returncode == 1
    assert {v["case"] for v in found} == {c["name"] for c in wrong.values()}
    for v in found:
        assert not v["agree"], v
        assert v["case"].partition(" (")[2].rstrip(")") in v["why"], v
