"""A skip or an xfail fails the suite: the plugin of tests/no_skips.py, run by pytest itself over
tests that skip in each way pytest offers, and loaded for this very run."""

from __future__ import annotations

import pytest

from tests import no_skips

SKIPPING = """
import pytest

@pytest.fixture
def skipping_fixture():
    pytest.skip("no cluster binaries")

def test_passes():
    pass

@pytest.mark.skip(reason="marked")
def test_marked_skip():
    pass

@pytest.mark.skipif(True, reason="condition")
def test_skipif():
    pass

def test_imperative_skip():
    pytest.skip("said so")

def test_skip_in_a_fixture(skipping_fixture):
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfailed():
    assert False

@pytest.mark.xfail(reason="fixed since")
def test_xpassed():
    pass

def test_imperative_xfail():
    pytest.xfail("not yet")
"""


@pytest.fixture(autouse=True)
def _quiet_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def test_every_kind_of_skip_and_xfail_is_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_skipping=SKIPPING)
    result = pytester.runpytest("-p", "no:cacheprovider", plugins=[no_skips])
    # A skip at set-up (a mark, a fixture) is an error of that test, one in its body a failure.
    result.assert_outcomes(passed=1, failed=4, errors=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for reason in ("no cluster binaries", "marked", "condition", "said so", "xfailed (known bug)"):
        result.stdout.fnmatch_lines([f"*{no_skips.WHY}*{reason}*"])
    result.stdout.fnmatch_lines([f"*{no_skips.WHY}xpassed (fixed since)*"])
    result.stdout.no_re_match_line(r".*\d+ (skipped|xfailed|xpassed)")


def test_a_module_skipped_at_collection_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_module_skip="import pytest\n"
        "pytest.importorskip('no_such_module_here')\n"
        "def test_x():\n"
        "    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider", plugins=[no_skips])
    result.assert_outcomes(errors=1)
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"*{no_skips.WHY}*no_such_module_here*"])


def test_without_the_plugin_the_same_tests_pass_which_is_why_it_exists(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_skipping=SKIPPING)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=4, xfailed=2, xpassed=1)
    assert result.ret == pytest.ExitCode.OK


def test_this_run_has_the_plugin(request: pytest.FixtureRequest) -> None:
    # tests/conftest.py loads it for every run under tests/, whatever selects the tests (tox, CI,
    # or a path given by hand).
    assert request.config.pluginmanager.is_registered(no_skips)
