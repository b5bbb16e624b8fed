"""kubernetes_asyncio's generated client loads on demand and still resolves every name the same way."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_fresh(code: str) -> str:
    # A fresh interpreter: in this one kubernetes_asyncio is already imported by other tests.
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_names_resolve_lazily_to_the_real_classes() -> None:
    out = run_fresh(
        """
        import sys
        from dra_node_agent import lean_imports
        assert lean_imports.install()
        assert not lean_imports.install()  # idempotent
        import kubernetes_asyncio
        from kubernetes_asyncio import client, config, watch
        from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi, V1Node
        from kubernetes_asyncio.client.exceptions import ApiException
        import kubernetes_asyncio.client.models as models
        assert kubernetes_asyncio.client is client
        assert models.V1Node is V1Node is client.V1Node
        assert V1Node.__module__ == "kubernetes_asyncio.client.models.v1_node"
        assert client.__version__
        loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
        print(len(loaded), "v1_pod" in " ".join(loaded))
        """
    )
    count, pod_loaded = out.split()
    assert int(count) < 100  # of ~770 model modules, only what was touched
    assert pod_loaded == "False"


def test_unknown_names_still_raise_attribute_error() -> None:
    run_fresh(
        """
        from dra_node_agent import lean_imports
        lean_imports.install()
        from kubernetes_asyncio import client
        try:
            client.NoSuchThing
        except AttributeError as exc:
            assert "NoSuchThing" in str(exc)
        else:
            raise SystemExit("expected AttributeError")
        """
    )
