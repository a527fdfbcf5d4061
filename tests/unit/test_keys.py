"""API key format: prefix, scope, key id, secret, checksum; HMAC storage."""

from __future__ import annotations

import pytest

from metering.keys import Scope, generate_key, hmac_matches, key_hmac, parse_key


@pytest.mark.parametrize("scope", list(Scope))
def test_generated_keys_parse_back(scope):
    key = generate_key(scope)
    assert key.raw.startswith(f"fm_{scope.value}_")
    parsed = parse_key(key.raw)
    assert parsed is not None and parsed.key_id == key.key_id and parsed.scope is scope


def test_a_single_typo_fails_the_checksum():
    raw = generate_key(Scope.INGEST).raw
    position = len("fm_ingest_") + 20
    typo = raw[:position] + ("0" if raw[position] != "0" else "1") + raw[position + 1 :]
    assert parse_key(typo) is None


@pytest.mark.parametrize("text", ["", "fm_", "fm_root_a_b_c", "sk_ingest_a_b_c", "fm_ingest_a_b"])
def test_malformed_keys_do_not_parse(text):
    assert parse_key(text) is None


def test_hmac_depends_on_the_pepper():
    raw = generate_key(Scope.ADMIN).raw
    stored = key_hmac(raw, "pepper-1")
    assert hmac_matches(raw, "pepper-1", stored)
    assert not hmac_matches(raw, "pepper-2", stored)
