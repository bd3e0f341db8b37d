#!/usr/bin/env bash
# Regenerate plugins/module_utils/_podresources_api_pb2.py from _podresources_api.proto with grpcio-tools
# (requirements-dev.txt). Only the messages are generated: the client and the test server name the one
# method, /v1.PodResourcesLister/List, themselves, so no *_pb2_grpc.py (whose absolute import of the
# _pb2 module would not work inside the collection) is needed.
# _podresources.py keeps a copy of the serialized descriptor (_DESCRIPTOR) for hosts whose protobuf is
# older than the generated module; this script says when that copy must change (a unit test checks it too).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/plugins/module_utils"
"$root/.venv/bin/python" -m grpc_tools.protoc -I. --python_out=. _podresources_api.proto
cd "$root"
PYTHONPATH=.build/collections "$root/.venv/bin/python" - <<'PY'
from ansible_collections.gpuops.mig.plugins.module_utils import _podresources, _podresources_api_pb2
new = _podresources_api_pb2.DESCRIPTOR.serialized_pb
if new != _podresources._DESCRIPTOR:
    print("Replace _DESCRIPTOR in plugins/module_utils/_podresources.py with:")
    print("_DESCRIPTOR = (")
    for start in range(0, len(new), 64):
        print("    %r" % new[start:start + 64])
    print(")")
PY
