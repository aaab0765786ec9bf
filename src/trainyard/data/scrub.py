"""Keep credentials out of logs and errors.

Every message the data layer logs or raises goes through ``scrub``: it hides the password
(and user) of ``scheme://user:pass@host`` URLs, the values of query parameters that carry
secrets (``X-Amz-Signature``, ``token``, ``sig``, ...), and the literal values of the
credential variables in the environment (``AWS_SECRET_ACCESS_KEY`` and friends) and of
secret fsspec options (``key``, ``secret``, ``token``, ``password``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["scrub", "secret_values", "SECRET_ENV", "MASK"]

MASK = "***"
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECURITY_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
)
"""Environment variables whose values never appear in a message."""

_SECRET_OPTIONS = (
    "key",
    "secret",
    "token",
    "password",
    "account_key",
    "sas_token",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
_SECRET_QUERY = re.compile(
    r"(?P<name>[?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"
    r"token|access_token|password|secret|key|awsaccesskeyid|se|sv)=)[^&\s#]+",
    re.IGNORECASE,
)
_MIN_SECRET_LEN = 4


def secret_values(
    env: Mapping[str, str] | None = None, options: Mapping[str, Any] | None = None
) -> list[str]:
    """Literal secrets to hide: credential variables of ``env`` (default ``os.environ``) and
    secret-named entries of ``options`` (fsspec storage options, searched one level deep)."""
    env = os.environ if env is None else env
    found = [env.get(name, "") for name in SECRET_ENV]
    for value in (options or {}).values():
        inner = value if isinstance(value, Mapping) else {}
        found += [str(v) for k, v in inner.items() if k.lower() in _SECRET_OPTIONS]
    return sorted({s for s in found if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with credentials masked as ``***``.

    Args:
        text: a message, URL or error text.
        secrets: literal values to hide; default ``secret_values()`` (the environment).

    Returns:
        The text with every URL's userinfo, secret query values and literal secrets masked.
    """
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _SECRET_QUERY.sub(lambda m: f"{m['name']}{MASK}", text)
    for secret in secret_values() if secrets is None else secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text
