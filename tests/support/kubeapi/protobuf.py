"""Decode the Kubernetes protobuf request bodies that helm 3.17 (and kubectl >= 1.37) send.

Wire format: the magic b"k8s\\x00", then a runtime.Unknown message
{1: typeMeta{1: apiVersion, 2: kind}, 2: raw, 3: contentEncoding, 4: contentType}
whose `raw` is the object itself. Only the kinds clients send as protobuf on our
paths are described: Secret and ConfigMap (helm release storage), DeleteOptions
and Eviction. Field numbers are those of the upstream generated.proto files.
Replies always stay JSON, which every client accepts.
"""

from __future__ import annotations

import base64
import datetime

from .errors import ApiError

MAGIC = b"k8s\x00"

# A schema maps field number -> (json name, type); a type is a scalar name, a
# schema dict (nested message) or ("repeated", type) / ("map", value type).
TIME = "time"
OWNER_REFERENCE = {5: ("apiVersion", "string"), 1: ("kind", "string"), 3: ("name", "string"),
                   4: ("uid", "string"), 6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")}
OBJECT_META = {
    1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
    5: ("uid", "string"), 6: ("resourceVersion", "string"), 7: ("generation", "int"),
    8: ("creationTimestamp", TIME), 9: ("deletionTimestamp", TIME), 10: ("deletionGracePeriodSeconds", "int"),
    11: ("labels", ("map", "string")), 12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("repeated", OWNER_REFERENCE)), 14: ("finalizers", ("repeated", "string")),
    # 17 managedFields is left out: the emulator keeps no field ownership.
}
SECRET = {1: ("metadata", OBJECT_META), 2: ("data", ("map", "bytes")), 3: ("type", "string"),
          4: ("stringData", ("map", "string")), 5: ("immutable", "bool")}
CONFIG_MAP = {1: ("metadata", OBJECT_META), 2: ("data", ("map", "string")),
              3: ("binaryData", ("map", "bytes")), 4: ("immutable", "bool")}
PRECONDITIONS = {1: ("uid", "string"), 2: ("resourceVersion", "string")}
DELETE_OPTIONS = {1: ("gracePeriodSeconds", "int"), 2: ("preconditions", PRECONDITIONS),
                  3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "string"),
                  5: ("dryRun", ("repeated", "string"))}
EVICTION = {1: ("metadata", OBJECT_META), 2: ("deleteOptions", DELETE_OPTIONS)}

SCHEMAS = {"Secret": SECRET, "ConfigMap": CONFIG_MAP, "DeleteOptions": DELETE_OPTIONS, "Eviction": EVICTION}
TYPE_META = {1: ("apiVersion", "string"), 2: ("kind", "string")}
UNKNOWN = {1: ("typeMeta", TYPE_META), 2: ("raw", "raw"), 3: ("contentEncoding", "string")}
TIMESTAMP = {1: ("seconds", "int"), 2: ("nanos", "int")}


def _varint(buf: bytes, pos: int):
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes):
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


def _scalar(kind, value):
    if kind == "string":
        return value.decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")  # JSON carries []byte as base64
    if kind == "raw":
        return value
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return value - (1 << 64) if value >= 1 << 63 else value
    if kind == TIME:
        stamp = _message(value, TIMESTAMP)
        if not stamp.get("seconds"):
            return None  # a zero metav1.Time is null in JSON
        moment = datetime.datetime.fromtimestamp(stamp["seconds"], datetime.timezone.utc)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return _message(value, kind)


def _message(buf: bytes, schema: dict) -> dict:
    out = {}
    for number, value in _fields(buf):
        if number not in schema:
            continue  # unknown fields are skipped, as protobuf readers do
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "repeated":
            out.setdefault(name, []).append(_scalar(kind[1], value))
        elif isinstance(kind, tuple) and kind[0] == "map":
            entry = dict(_fields(value))
            out.setdefault(name, {})[entry.get(1, b"").decode("utf-8")] = _scalar(kind[1], entry.get(2, b""))
        else:
            decoded = _scalar(kind, value)
            if decoded not in (None, ""):  # Go writes empty strings; JSON omits them
                out[name] = decoded
    return out


def decode(body: bytes) -> dict:
    """A protobuf request body as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "protobuf body lacks the k8s\\0 prefix")
    envelope = _message(body[len(MAGIC):], UNKNOWN)
    type_meta = envelope.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if kind not in SCHEMAS:
        raise ApiError(415, "UnsupportedMediaType",
                       f"the emulator cannot decode protobuf {kind or 'objects without a kind'}; "
                       "add its schema to tests/support/kubeapi/protobuf.py")
    obj = _message(envelope.get("raw", b""), SCHEMAS[kind])
    return {"apiVersion": type_meta.get("apiVersion", "v1"), "kind": kind, **obj}
