"""A pytest plugin under which a skipped or xfailed test fails, and so does an xpassed one.

A skipped test proves nothing, yet pytest's exit status counts it as a success: a cluster test that
skipped for want of its binaries, or an ``xfail`` left behind after a fix, would let CI pass without
the check ever running. No test of this project skips legitimately, so the rule holds everywhere,
not only where ``CI`` is set: ``tests/conftest.py`` loads this plugin for every run under
``tests/`` (``tests/hardware``, run by path with its own ``--confcutdir``, is not under it, and
fails rather than skips without a GPU anyway).

The report is rewritten, not the test: the phase that skipped (collection, set-up or the call)
becomes a failure whose text says why the test did not run, so the summary names each one.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

WHY = "a skipped or xfailed test fails this suite (tests/no_skips.py): "


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    # A skip's longrepr is (path, line, "Skipped: reason"); an xfail says why in `wasxfail`.
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _as_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    xfail = getattr(report, "wasxfail", None)
    if xfail is not None:
        what = "xpassed" if report.passed else "xfailed"
        text = f"{WHY}{what}" + (f" ({xfail})" if xfail else "")
        del report.wasxfail  # else pytest's terminal counts it as xfailed/xpassed again
    elif report.skipped:
        text = WHY + _skip_reason(report)
    else:
        return
    report.outcome = "failed"
    report.longrepr = text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _as_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    # pytest.skip(allow_module_level=True) and pytest.importorskip at import time skip a whole
    # module at collection.
    report = yield
    _as_failure(report)
    return report
