"""The selector parser: one per thread, loaded from one analysis of the grammar per process."""

from __future__ import annotations

import threading

import pytest

from dra_operator.cel import parser


def test_threads_get_their_own_parsers_from_one_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = 0
    build = parser._build

    def counted() -> object:
        nonlocal builds
        builds += 1
        return build()

    monkeypatch.setattr(parser, "_build", counted)
    monkeypatch.setattr(parser, "_analysed", None)
    expression = 'device.attributes["gpu.nvidia.com"].?productName.orValue("") == "H100" && true'
    found: dict[str, tuple[object, object]] = {}

    def in_thread(name: str) -> None:
        parser._local.__dict__.pop("parser", None)  # a fresh thread has none; be sure
        found[name] = (parser.parse(expression), parser._local.parser)

    threads = [threading.Thread(target=in_thread, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert builds == 1
    trees = {repr(tree) for tree, _ in found.values()}
    parsers = {id(p) for _, p in found.values()}
    assert len(found) == 3
    assert len(trees) == 1
    assert len(parsers) == 3
