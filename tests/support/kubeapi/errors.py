"""API errors, answered as metav1.Status bodies like the real API server does.

Messages name the resource as the API server's schema.GroupResource prints it, the plural qualified by
its group (`leases.coordination.k8s.io`, `nodes`), as in apimachinery's
staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go (NewNotFound, NewAlreadyExists, NewConflict,
NewInvalid).
"""

from __future__ import annotations


# One error class for both test clusters: the emulator answers with it, the real one's client raises it.
from tests.support.controlplane.client import ApiError  # noqa: E402  pylint: disable=wrong-import-position


def qualified(res) -> str:
    """The resource as schema.GroupResource.String() prints it."""
    return f"{res.plural}.{res.group}" if res.group else res.plural


def not_found(res, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(res)} "{name}" not found',
                    {"name": name, "group": res.group, "kind": res.plural})


def already_exists(res, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified(res)} "{name}" already exists',
                    {"name": name, "group": res.group, "kind": res.plural})


def conflict(res, name: str) -> ApiError:
    """A write whose resourceVersion (or delete precondition) is not the stored one: the generic registry's
    OptimisticLockErrorMsg (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go)."""
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {qualified(res)} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    {"name": name, "group": res.group, "kind": res.plural})


def resource_version_required(res, name: str) -> ApiError:
    """A PUT without metadata.resourceVersion to a kind whose strategy does not allow unconditional updates
    (store.go, Update: "must be specified for an update")."""
    cause = "Invalid value: 0x0: must be specified for an update"
    return ApiError(422, "Invalid", f'{qualified(res)} "{name}" is invalid: metadata.resourceVersion: {cause}',
                    {"name": name, "group": res.group, "kind": res.plural,
                     "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": "metadata.resourceVersion"}]})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
