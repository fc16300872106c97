"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

The official client maps the status to its exception types (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 413/422 ...) and retries 408/409/429/5xx, so a
refusal is always a 4xx that says what to change, never a 5xx.
"""
from __future__ import annotations

import json
from typing import Dict, Optional

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         415: "invalid_request_error", 422: "invalid_request_error", 499: "invalid_request_error",
         500: "server_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(exc: ApiError):
    from starlette.responses import Response

    return Response(json.dumps(exc.body()), status_code=exc.status, media_type="application/json",
                    headers=exc.headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def decode_failure(exc: Exception) -> ApiError:
    """An engine failure as an error object: 503 when the exception says the service is down for
    now (a pipeline that lost a rank: adapters/pipeline/ sets http_status), else 500."""
    status = getattr(exc, "http_status", 500)
    code = "service_unavailable" if status == 503 else "decode_failed"
    return ApiError(status, f"The decode failed: {type(exc).__name__}: {exc}", code=code)
