"""API errors, answered as metav1.Status bodies like the real API server does."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(res, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.plural} "{name}" not found',
                    {"name": name, "group": res.group, "kind": res.plural})


def already_exists(res, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{res.plural} "{name}" already exists',
                    {"name": name, "group": res.group, "kind": res.plural})


def conflict(res, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    {"name": name, "group": res.group, "kind": res.plural})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
