#!/usr/bin/env bash
# Regenerate plugins/module_utils/_podresources_api_pb2.py from _podresources_api.proto with grpcio-tools
# (requirements-dev.txt). Only the messages are generated: the client and the test server name the one
# method, /v1.PodResourcesLister/List, themselves, so no *_pb2_grpc.py (whose absolute import of the
# _pb2 module would not work inside the collection) is needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/plugins/module_utils"
"$root/.venv/bin/python" -m grpc_tools.protoc -I. --python_out=. _podresources_api.proto
