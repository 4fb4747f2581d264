"""One TLS context for the HTTP clients the tests make, built once per process.

httpx builds a new `ssl.SSLContext` for every client it makes (and the openai SDK makes an httpx
client for each of its clients), loading the whole CA bundle each time: about 45 ms of CPU,
more than most loopback tests spend on their requests. The servers under test speak plain HTTP,
so the context is never used for a connection; it is built here once, the way httpx builds it
(`httpx.create_ssl_context()`), and handed to the clients as `verify=`. The clients are the
real ones with their own defaults: `sdk_http_client()` is the openai SDK's `DefaultHttpxClient`.
"""

from __future__ import annotations

import httpx
from openai import DefaultAsyncHttpxClient, DefaultHttpxClient

CLIENT_TLS = httpx.create_ssl_context()


def sdk_http_client() -> httpx.Client:
    """The HTTP client the openai SDK would make for itself, with the shared TLS context."""
    return DefaultHttpxClient(verify=CLIENT_TLS)


def sdk_async_http_client() -> httpx.AsyncClient:
    """The async HTTP client the openai SDK would make for itself, with the shared context."""
    return DefaultAsyncHttpxClient(verify=CLIENT_TLS)
