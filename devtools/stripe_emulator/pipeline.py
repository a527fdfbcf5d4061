"""The path of one Stripe API request: auth → route → fault → idempotency → lock → handler.

Returns a ``Reply`` that the HTTP layer writes (or, for ``drop``, closes the connection
without writing). Faults drawn before processing leave no trace in state or in the
idempotency store; ``drop_after_commit`` happens after both were written.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from devtools.stripe_emulator import errors, faults, routes, versions
from devtools.stripe_emulator.forms import parse_form
from devtools.stripe_emulator.idempotency import IdempotencyStore, StoredResponse
from devtools.stripe_emulator.rate_limit import RateLimiter
from devtools.stripe_emulator.state import EmulatorState

log = logging.getLogger(__name__)
KEY_PREFIXES = ("sk_test_", "rk_test_")


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering

    @classmethod
    def dropped(cls) -> Reply:
        return cls(0, b"", drop=True)


def json_reply(status: int, data: Any, headers: dict[str, str] | None = None) -> Reply:
    body = json.dumps(data, separators=(",", ":")).encode()
    return Reply(status, body, {"Content-Type": "application/json", **(headers or {})})


class Emulator:
    """State plus the request-level machinery (idempotency, faults) around it."""

    def __init__(self, state: EmulatorState | None = None) -> None:
        self.state = state or EmulatorState()
        self.idempotency = IdempotencyStore()
        self.faults = faults.FaultPlan()
        self.limiter = RateLimiter()
        self.stopping = threading.Event()

    def reset(self) -> None:
        self.state.reset()
        self.idempotency.clear()
        self.faults.clear()
        self.limiter.clear()

    def handle_api(
        self, method: str, path: str, query: str, headers: dict[str, str], body: str
    ) -> Reply:
        state = self.state
        state.count("requests")
        base = {"Request-Id": state.next_request_id()}
        try:
            _authenticate(headers.get("authorization"))
            version = versions.requested(headers.get("stripe-version"), state.settings.api_version)
            base["Stripe-Version"] = version
            found = routes.match(method, path)
            if found is None:
                raise errors.unrecognized_url(method, path)
            self.limiter.admit(found[0].endpoint, state.settings)
            fault = self.faults.draw(method, path)
            if fault is not None:
                state.count(f"fault:{fault}")
                early = self._early_fault(fault)
                if early is not None:
                    return early
            params = parse_form(body if method == "POST" else query)
            key = headers.get("idempotency-key") if method == "POST" else None
            if key:
                base["Idempotency-Key"] = key
            route, args = found
            call = routes.Call(state, params, args, key, version)
            reply = self._execute(route, call, f"{method} {path}", fault, base)
        except errors.StripeError as exc:
            reply = _error_reply(exc, base)
        state.count(f"status:{reply.status}")
        return reply

    def _early_fault(self, fault: str) -> Reply | None:
        if fault == "429":
            raise errors.rate_limited()
        if fault == "500":
            raise errors.api_error()
        if fault == "timeout":
            # Outlast the client's timeout, then hang up: nothing was processed.
            self.stopping.wait(self.state.settings.timeout_s)
            return Reply.dropped()
        return None

    def _execute(
        self,
        route: routes.Route,
        call: routes.Call,
        endpoint: str,
        fault: str | None,
        base: dict[str, str],
    ) -> Reply:
        state, key = self.state, call.idempotency_key
        if key:
            now, window = state.clock.now(), state.settings.idempotency_window_s
            stored = self.idempotency.begin(key, endpoint, call.params, now, window)
            if stored is not None:
                state.count("idempotent_replays")
                return _after(fault, _replay(stored, base))
        try:
            reply = self._run_locked(route, call, fault, base)
        except BaseException:
            if key:
                self.idempotency.abandon(key)
            raise
        return _after(fault, reply)

    def _run_locked(
        self, route: routes.Route, call: routes.Call, fault: str | None, base: dict[str, str]
    ) -> Reply:
        state = self.state
        slot = route.lock_key(state, call.params) if route.lock_key else None
        if slot is not None and not state.try_enter(slot):
            state.count("lock_timeouts")
            raise errors.lock_timeout()
        try:
            reply = self._run_handler(route, call, base, fault)
            if fault == "slow":
                self.stopping.wait(state.settings.slow_s)
            return reply
        finally:
            if slot is not None:
                state.leave(slot)

    def _run_handler(
        self, route: routes.Route, call: routes.Call, base: dict[str, str], fault: str | None
    ) -> Reply:
        if fault == "stored_500":
            # Execution began and failed before changing anything; Stripe keeps the 500.
            reply = _error_reply(errors.stored_api_error(), base)
        else:
            reply = self._call_handler(route, call, base)
        if fault == "stored_500_after_commit":
            reply = _error_reply(errors.stored_api_error(), base)
        if call.idempotency_key:
            stored = StoredResponse(
                reply.status, reply.body, dict(reply.headers), base["Request-Id"]
            )
            now = self.state.clock.now()
            window = self.state.settings.idempotency_window_s
            self.idempotency.finish(call.idempotency_key, stored, now, window)
        return reply

    def _call_handler(self, route: routes.Route, call: routes.Call, base: dict[str, str]) -> Reply:
        try:
            body = versions.reshape(route.handler(call), call.api_version, call.state)
            return json_reply(200, body, base)
        except errors.StripeError as exc:
            if not exc.stored:
                raise
            return _error_reply(exc, base)
        except Exception:
            log.exception("stripe emulator handler failed")
            raise errors.api_error() from None


def _after(fault: str | None, reply: Reply) -> Reply:
    return Reply.dropped() if fault == "drop_after_commit" else reply


def _replay(stored: StoredResponse, base: dict[str, str]) -> Reply:
    headers = {
        **stored.headers,
        **base,
        "Idempotent-Replayed": "true",
        "Original-Request": stored.request_id,
    }
    return Reply(stored.status, stored.body, headers)


def _error_reply(exc: errors.StripeError, base: dict[str, str]) -> Reply:
    return json_reply(exc.status, exc.body(), {**base, **exc.headers})


def _authenticate(authorization: str | None) -> None:
    key = _api_key(authorization)
    if not key or not key.startswith(KEY_PREFIXES):
        raise errors.authentication(key)


def _api_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value).decode().partition(":")[0]
        except ValueError:
            return None
    return None
