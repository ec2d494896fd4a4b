"""API keys with scopes and limits. A line of a key file is a key, then
optional fields: `scope=` one or more of inference (the generating and
embedding routes), read (models, props, metrics, the slot list) and admin
(slot actions, a request's `id_slot`, shutdown); `inflight=N` requests at
once; `rate=N/s` or `N/min` with `burst=N` (default N). A key without fields
may do everything, without limits, as a key always could. Out of scope is a
403 naming the scope; over a limit a 429 with Retry-After."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

from ember.server.errors import ApiError

__all__ = ["SCOPES", "KeyLimits", "KeyRule", "parse_key_line", "refusal", "scope_needed"]

SCOPES = ("inference", "read", "admin")

_READ_PATHS = frozenset({"/v1/models", "/models", "/props", "/metrics", "/slots", "/api/tags", "/api/ps", "/api/show",
                         "/api/version", "/", "/openapi.json"})
_RATE = re.compile(r"(\d+(?:\.\d+)?)/(s|sec|second|min|minute)")


@dataclass(frozen=True)
class KeyRule:
    scopes: frozenset[str] = frozenset(SCOPES)
    #: requests of this key at once (None: no limit)
    inflight: int | None = None
    #: requests a second, refilled continuously, and how many may come at once
    rate: float | None = None
    burst: int | None = None


def parse_key_line(line: str) -> tuple[str, KeyRule]:
    """The key and rule of one key file line; ValueError says what is wrong."""
    key, *fields = line.split()
    seen: dict[str, str] = {}
    for f in fields:
        name, eq, value = f.partition("=")
        if not eq or not value:
            raise ValueError(f"{f!r}: expected name=value (scope, inflight, rate, burst)")
        if name in seen:
            raise ValueError(f"{name} given twice")
        seen[name] = value
    scopes = frozenset(SCOPES)
    if "scope" in seen:
        scopes = frozenset(s.strip() for s in seen.pop("scope").split(","))
        if not scopes or not scopes <= set(SCOPES):
            raise ValueError(f"scope: expected some of {', '.join(SCOPES)}, got {','.join(sorted(scopes))}")
    inflight = _count(seen.pop("inflight")) if "inflight" in seen else None
    rate = burst = None
    if "rate" in seen:
        m = _RATE.fullmatch(seen.pop("rate"))
        if m is None or float(m.group(1)) <= 0:
            raise ValueError("rate: expected N/s or N/min, N above 0")
        n = float(m.group(1))
        rate = n if m.group(2).startswith("s") else n / 60
        burst = max(1, math.ceil(n))
    if "burst" in seen:
        if rate is None:
            raise ValueError("burst: needs a rate")
        burst = _count(seen.pop("burst"))
    if seen:
        raise ValueError(f"unknown field {next(iter(seen))!r} (scope, inflight, rate, burst)")
    return key, KeyRule(scopes, inflight, rate, burst)


def _count(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"{v!r}: expected a count of at least 1")
    return int(v)


def scope_needed(method: str, path: str) -> str:
    """The scope a request needs: admin for slot actions and shutdown, read
    for what describes the server, inference for the rest."""
    if path == "/shutdown" or (path.startswith("/slots/") and method == "POST"):
        return "admin"
    if path in _READ_PATHS and (method in ("GET", "HEAD") or path == "/api/show"):
        return "read"
    if path.startswith(("/v1/models/", "/models/")) and method in ("GET", "HEAD"):
        return "read"  # one model by its name
    return "inference"


@dataclass
class _Use:
    inflight: int = 0
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)


class KeyLimits:
    """Each limited key's requests in flight and its rate's bucket."""

    def __init__(self, rules: dict[str, KeyRule]):
        self.rules = rules
        self._use = {k: _Use(tokens=float(r.burst or 0)) for k, r in rules.items()}

    def enter(self, key: str) -> None:
        """Counts a request of `key` in, or refuses it (429) over a limit."""
        rule, use = self.rules.get(key), self._use.get(key)
        if rule is None or use is None:
            return
        if rule.inflight is not None and use.inflight >= rule.inflight:
            raise refusal("inflight", 429, f"this key has {rule.inflight} request{'s' * (rule.inflight != 1)} "
                          "in flight already, its limit", type="rate_limit_error", headers={"Retry-After": "1"})
        if rule.rate is not None:
            now = time.monotonic()
            use.tokens = min(float(rule.burst or 1), use.tokens + (now - use.at) * rule.rate)
            use.at = now
            if use.tokens < 1:
                wait = math.ceil((1 - use.tokens) / rule.rate)
                raise refusal("rate", 429, f"this key's rate is {_per(rule.rate)}; retry in {wait} s",
                              type="rate_limit_error", headers={"Retry-After": str(wait)})
            use.tokens -= 1
        use.inflight += 1

    def leave(self, key: str) -> None:
        use = self._use.get(key)
        if use is not None and key in self.rules:
            use.inflight = max(0, use.inflight - 1)


def refusal(cause: str, status: int, message: str, **kw) -> ApiError:
    """An ApiError that /metrics counts under `cause`."""
    e = ApiError(status, message, **kw)
    e.cause = cause  # type: ignore[attr-defined]
    return e


def _per(rate: float) -> str:
    return f"{rate:g}/s" if rate >= 1 else f"{rate * 60:g}/min"
