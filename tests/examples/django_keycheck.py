"""A Django middleware that checks an API key, for `test_django_keycheck.py`."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

KEY = "right-key"


class KeyCheck:
    """Answers 401 with an OpenAI error body to requests without the key."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.headers.get("x-api-key") != KEY:
            error = {"type": "invalid_request_error", "code": "invalid_api_key", "message": "No."}
            return JsonResponse({"error": error}, status=401)
        return self.get_response(request)
