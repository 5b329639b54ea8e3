"""Who a request comes from: API keys per tenant, what each may see, and its limits.

``--api-keys FILE`` holds one key per line: ``NAME KEY`` then, optionally, ``admin`` and limits
``watches=N``, ``sessions=N``, ``requests=N`` (running watches, open sessions and requests in
progress); ``#`` starts a comment. A tenant sees and stops only its own watches and sessions
(another's are 404, as if absent); an admin sees all. The single ``--api-key`` is an admin
tenant named ``default``; a server without keys has one open tenant that sees everything, as
before. Keys are compared in constant time against every key and never logged or shown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import threading
from pathlib import Path

from vidsight.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LIMITS = {"watches": "max_watches", "sessions": "max_sessions", "requests": "max_requests"}


@dataclasses.dataclass(frozen=True)
class Tenant:
    """One API key's holder.

    Attributes:
        name: Shown in records (``tenant``) and refusals; never the key.
        admin: Sees and stops every tenant's watches and sessions.
        max_watches: Running watches at once (None: no limit).
        max_sessions: Open chat sessions at once.
        max_requests: ``/v1`` requests in progress at once (event streams are not counted).
    """

    name: str
    admin: bool = False
    max_watches: int | None = None
    max_sessions: int | None = None
    max_requests: int | None = None

    def sees(self, record: dict) -> bool:
        """Whether this tenant may see (and stop) a watch's or session's ``record``."""
        return self.admin or record.get("tenant") == self.name


OPEN = Tenant("default", admin=True)


@dataclasses.dataclass(frozen=True)
class ApiKey:
    tenant: Tenant
    key: str = dataclasses.field(repr=False)


def read_api_keys(path: str | Path) -> tuple[ApiKey, ...]:
    """The keys of an ``--api-keys`` file (see the module docstring)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the API keys file ({exc})") from None
    keys = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 2 or not _NAME.match(words[0]):
            raise ConfigError(f"{path}, line {number}: expected 'NAME KEY [admin] [watches=N] [sessions=N] "
                              "[requests=N]' with a name of letters, digits, '.', '_' or '-'")
        fields = {"admin": False}
        for option in words[2:]:
            label, _, value = option.partition("=")
            if option == "admin":
                fields["admin"] = True
            elif label in LIMITS and value.isdigit() and int(value) > 0:
                fields[LIMITS[label]] = int(value)
            else:
                raise ConfigError(f"{path}, line {number}: unknown option {option!r} (admin, watches=N, sessions=N, "
                                  "requests=N with N a positive whole number)")
        keys.append(ApiKey(Tenant(words[0], **fields), words[1]))
    if any(len(k.key) < 8 for k in keys):
        raise ConfigError(f"{path}: a key shorter than 8 characters")
    return check_keys(keys, str(path))


def check_keys(keys, source: str) -> tuple[ApiKey, ...]:
    names = [k.tenant.name for k in keys]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: a tenant is named twice")
    if len({k.key for k in keys}) != len(keys):
        raise ConfigError(f"{source}: two tenants share a key")
    return tuple(keys)


def identify(keys: tuple[ApiKey, ...], authorization: str) -> Tenant | None:
    """The tenant whose key ``authorization`` (``Bearer KEY``) carries; every key is compared, in
    constant time, so the time taken says nothing of which matched or how nearly."""
    presented = authorization.encode()
    found = None
    for entry in keys:
        if secrets.compare_digest(presented, b"Bearer " + entry.key.encode()):
            found = entry.tenant
    return found


class RequestCounter:
    """Requests in progress per tenant, refused past the tenant's ``max_requests``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}

    @contextlib.contextmanager
    def admit(self, tenant: Tenant, count: int = 1):
        """Count ``count`` requests of ``tenant`` in progress for the block (a completion's ``n``
        answers count ``n - 1`` more beside the request itself)."""
        from vidsight.api.serve.media import RequestError

        with self._lock:
            running = self._running.get(tenant.name, 0)
            if tenant.max_requests is not None and running + count > tenant.max_requests:
                raise RequestError(429, f"tenant {tenant.name}: {running} requests in progress, its limit "
                                        f"(requests={tenant.max_requests})"
                                        + (f"; {count} more wanted" if count > 1 else ""))
            self._running[tenant.name] = running + count
        try:
            yield
        finally:
            with self._lock:
                self._running[tenant.name] -= count
