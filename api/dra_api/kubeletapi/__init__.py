"""The kubelet's plugin gRPC protocols: DRA v1 and v1beta1, plugin registration v1, health v1 and v1alpha1.

The ``.proto`` files here restate the upstream kubelet APIs with their exact proto packages, message
names and field numbers (the proto package is part of every gRPC method path kubelet calls). The
``*_pb2.py``, ``*_pb2_grpc.py`` and ``.pyi`` modules are generated and committed; regenerate them with
``python -m dra_api.kubeletapi.regenerate`` (needs grpcio-tools and mypy-protobuf, the dev extra).

``model`` holds plain dataclasses for the same data and ``convert`` translates between them and the
protobuf messages of either DRA version; both the node agent's servers and the kubelet test client use
them, so neither deals with protobuf objects in its own logic.
"""
