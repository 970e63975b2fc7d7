"""The names of the Redis tier's environment variables (documented in :mod:`jitkey.remote`, which re-exports
them). A module of their own so that code that only asks whether the tier is configured
(:func:`jitkey.triton.install`, at a kernel library's import) does not import the tier itself: ``jitkey.remote``
and its protocol module take about 2.6 ms to import, as long as the rest of ``install()``."""

from __future__ import annotations

from typing import Final

ENV_URL: Final[str] = "JITKEY_REMOTE_CACHE"
ENV_NAMESPACE: Final[str] = "JITKEY_REMOTE_NAMESPACE"
ENV_SECRET: Final[str] = "JITKEY_REMOTE_SECRET"
ENV_TIMEOUT: Final[str] = "JITKEY_REMOTE_TIMEOUT"
ENV_CONNECT_TIMEOUT: Final[str] = "JITKEY_REMOTE_CONNECT_TIMEOUT"
ENV_BACKOFF: Final[str] = "JITKEY_REMOTE_BACKOFF"
