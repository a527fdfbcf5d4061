"""Console sessions live server-side: sign-out and revocation end them, the pepper mints none."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from api.console.session import LOGIN_COOKIE, SESSION_COOKIE
from metering.db import raw_transaction
from metering.keys import parse_key
from metering.keys_repo import revoke_key
from tests.helpers.database import TEST_PEPPER

pytestmark = pytest.mark.timeout(120)
SIGNED_IN_PAGE = "/console/"


def sign_in(client: Any, key: str) -> str:
    """The session cookie a browser gets for ``key`` (double-submit nonce included)."""
    client.cookies.clear()
    reply = client.post(
        "/console/login",
        data={"key": key, "csrf": "nonce", "next": SIGNED_IN_PAGE},
        headers={"cookie": f"{LOGIN_COOKIE}=nonce"},
        follow_redirects=False,
    )
    assert reply.status_code == 303, reply.text
    token = reply.cookies[SESSION_COOKIE]
    client.cookies.clear()
    return token


def visit(client: Any, token: str, path: str = SIGNED_IN_PAGE) -> Any:
    client.cookies.clear()
    return client.get(path, headers={"cookie": f"{SESSION_COOKIE}={token}"}, follow_redirects=False)


def signed_in(reply: Any) -> bool:
    if reply.status_code == 303:
        assert reply.headers["location"].startswith("/console/login")
        return False
    assert reply.status_code == 200, reply.text
    return True


def sign_out(client: Any, token: str) -> Any:
    page = visit(client, token)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    client.cookies.clear()
    return client.post(
        "/console/logout",
        data={"csrf": csrf.group(1)},
        headers={"cookie": f"{SESSION_COOKIE}={token}"},
        follow_redirects=False,
    )


def test_a_cookie_stops_working_at_sign_out(client, make_key):
    key = make_key(scope="support")
    token, other_tab = sign_in(client, key), sign_in(client, key)
    assert signed_in(visit(client, token))
    assert sign_out(client, token).status_code == 303
    assert not signed_in(visit(client, token))  # the old cookie, replayed
    assert not signed_in(visit(client, token, "/console/audit"))
    assert signed_in(visit(client, other_tab))  # another sign-in of the same key lives on


def test_revoking_the_key_ends_its_console_sessions_at_once(client, make_key, engine):
    key = make_key(scope="admin")
    token = sign_in(client, key)
    assert signed_in(visit(client, token))
    with raw_transaction(engine) as conn:
        revoke_key(conn, parse_key(key).key_id)  # type: ignore[union-attr]
    # Well within FAIRMETER_KEY_CACHE_TTL_S (30 s): the very next request is refused.
    assert not signed_in(visit(client, token))


def test_the_pepper_and_a_key_id_alone_mint_no_session(client, make_key):
    """The old cookie was ``payload.HMAC(pepper)``: anyone with the (default) pepper and a key
    id from the logs could forge an admin session. Such a cookie now opens nothing."""
    key_id = parse_key(make_key(scope="admin")).key_id  # type: ignore[union-attr]
    payload = {"k": key_id, "t": "acme", "s": "admin", "exp": 4102444800, "n": "forged"}
    body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode())
    encoded = body.rstrip(b"=").decode()
    signing_key = hmac.new(TEST_PEPPER.encode(), b"console-session", hashlib.sha256).digest()
    signature = hmac.new(signing_key, encoded.encode(), hashlib.sha256).digest()
    forged = f"{encoded}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    assert not signed_in(visit(client, forged))


def test_sessions_expire_after_eight_hours(client, make_key):
    key = make_key(scope="support")
    start = datetime.now(UTC)
    with freeze_time(start) as clock:
        token = sign_in(client, key)
        clock.tick(timedelta(hours=8) - timedelta(seconds=1))
        assert signed_in(visit(client, token))
        clock.tick(timedelta(seconds=1))
        assert not signed_in(visit(client, token))


def test_only_a_hash_of_the_session_token_is_stored(client, make_key, db):
    token = sign_in(client, make_key(scope="support"))
    stored = [row[0] for row in db.execute("SELECT token_sha256 FROM console_sessions")]
    assert stored == [hashlib.sha256(token.encode()).hexdigest()]
    assert len(token) >= 40  # 32 random bytes


@pytest.mark.parametrize("cookie", ["", "x", "a" * 5000, "not.a.session", "%00"])
def test_junk_cookies_send_the_visitor_to_sign_in(client, db, cookie):
    assert not signed_in(visit(client, cookie))
