"""Regenerate the Python modules for the kubelet plugin protos in this folder.

Run from anywhere with the dev extra installed (grpcio-tools, mypy-protobuf)::

    .venv/bin/python -m dra_api.kubeletapi.regenerate

protoc is given the ``api/`` folder as its include root and the protos by their path below it, so the
generated ``*_pb2_grpc.py`` import their messages as ``dra_api.kubeletapi.<name>_pb2`` without any
editing. The mypy-protobuf plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) must be on PATH or next to
the running interpreter; they write the ``.pyi`` stubs that make ``mypy --strict`` work for callers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROTOS = (
    "dra_v1.proto",
    "dra_v1beta1.proto",
    "pluginregistration_v1.proto",
    "health_v1alpha1.proto",
    "health_v1.proto",
)


def main() -> int:
    package_dir = Path(__file__).resolve().parent
    include_root = package_dir.parent.parent  # the folder that holds dra_api/
    relative = package_dir.relative_to(include_root)
    # The mypy-protobuf plugins are console scripts installed next to the interpreter.
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{include_root}",
        f"--python_out={include_root}",
        f"--grpc_python_out={include_root}",
        f"--mypy_out={include_root}",
        f"--mypy_grpc_out={include_root}",
        *(str(relative / name) for name in PROTOS),
    ]
    return subprocess.run(command, cwd=include_root, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
