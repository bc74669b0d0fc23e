#!/usr/bin/env python3
"""Mint JWT fixtures for the gateway's JWT verification tests.

Usage: python3 tests/jwt/mint.py <dir> <issuer> <audience>

Writes into <dir> (fresh keys on every run):
  jwks.json       public JWK Set: ec-1 (ES256), rsa-1 (RS256), rsa-ps (the same
                  RSA key for PS256: a key that names its alg verifies only that),
                  ed-1 (EdDSA)
  rsa_public.pem  the rsa-1 public key (SubjectPublicKeyInfo PEM)
  hs_secret.txt   the shared HS256 secret, no trailing newline
  tokens.json     {case name: compact JWS}

Every token carries the default claims (iss, aud, sub=user-1, iat, exp=+600s,
scope, tenant, plan, rate_limit, realm_access.roles, a URL-named tenant claim)
unless the case says otherwise. Cases:

  valid_es256, valid_rs256,   accepted: one per algorithm; PS256 uses the
  valid_eddsa, valid_ps256    RSA key under kid rsa-ps
  valid_es256_sub2   accepted: a second identity (user-2, globex, free)
  alg_none           rejected: unsigned token, header alg "none", empty signature
  hs256_confusion    rejected: HS256 keyed with the bytes of rsa_public.pem,
                     kid rsa-1 (algorithm confusion)
  expired            rejected: exp one hour ago
  not_yet_valid      rejected: nbf one hour ahead (exp pushed past nbf so that
                     nbf is the only fault)
  wrong_iss          rejected: iss is https://evil.example
  wrong_aud          rejected: aud is someone-else
  unknown_kid        rejected: signed by an EC key outside the set
  bad_signature      rejected: valid_es256 with one signature character changed
  huge               rejected on size: valid ES256 token over 64 KiB
  bad_base64         rejected: payload segment has non-base64url characters
  bad_json           rejected: correctly signed, payload is truncated JSON
  duplicate_claims   rejected: correctly signed, "sub" appears twice
  crit_header        rejected: correctly signed, unknown "crit" extension
  no_exp             rejected: correctly signed, no exp claim
  hs256_secret       accepted by an HS256 issuer keyed with hs_secret.txt
                     (no kid)

Prints "ok" on success; on failure prints a message to stderr and exits 1.
"""

import base64
import hashlib
import hmac
import json
import sys
import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

HS_SECRET = "an-hs256-test-secret-of-32-bytes!"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def compact(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def es256_by_hand(header: dict, payload: bytes, key) -> str:
    """ES256 over b64(header).b64(payload); JWS wants raw r||s, not DER."""
    signing_input = f"{b64(compact(header))}.{b64(payload)}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def mint(out: Path, issuer: str, audience: str) -> None:
    now = int(time.time())
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed_key = ed25519.Ed25519PrivateKey.generate()
    stranger = ec.generate_private_key(ec.SECP256R1())

    jwks = []
    for kid, alg, to_jwk, key in [
        ("ec-1", "ES256", ECAlgorithm.to_jwk, ec_key),
        ("rsa-1", "RS256", RSAAlgorithm.to_jwk, rsa_key),
        ("rsa-ps", "PS256", RSAAlgorithm.to_jwk, rsa_key),
        ("ed-1", "EdDSA", OKPAlgorithm.to_jwk, ed_key),
    ]:
        jwk = to_jwk(key.public_key(), as_dict=True)
        jwk.pop("key_ops", None)  # RFC 7517 4.3: don't combine "use" and "key_ops"
        jwks.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})

    rsa_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    base = {
        "iss": issuer,
        "aud": audience,
        "sub": "user-1",
        "iat": now,
        "exp": now + 600,
        "scope": "orders:read orders:write",
        "tenant": "acme",
        "plan": "pro",
        "rate_limit": 3,
        "realm_access": {"roles": ["orders-admin"]},
        "https://example.com/tenant": "acme-url",
    }

    def claims(**changes):
        c = {**base, **changes}
        return {k: v for k, v in c.items() if v is not None}

    def es256(payload, kid="ec-1", key=ec_key):
        return jwt.encode(payload, key, algorithm="ES256", headers={"kid": kid})

    t = {}
    t["valid_es256"] = es256(claims())
    t["valid_rs256"] = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
    t["valid_eddsa"] = jwt.encode(claims(), ed_key, algorithm="EdDSA", headers={"kid": "ed-1"})
    t["valid_ps256"] = jwt.encode(claims(), rsa_key, algorithm="PS256", headers={"kid": "rsa-ps"})
    t["valid_es256_sub2"] = es256(
        claims(**{"sub": "user-2", "tenant": "globex", "plan": "free",
                  "https://example.com/tenant": "globex-url"})
    )

    t["alg_none"] = f"{b64(compact({'alg': 'none', 'typ': 'JWT'}))}.{b64(compact(claims()))}."

    signing_input = f"{b64(compact({'alg': 'HS256', 'kid': 'rsa-1'}))}.{b64(compact(claims()))}"
    mac = hmac.new(rsa_pem, signing_input.encode(), hashlib.sha256).digest()
    t["hs256_confusion"] = f"{signing_input}.{b64(mac)}"

    t["expired"] = es256(claims(iat=now - 7200, exp=now - 3600))
    t["not_yet_valid"] = es256(claims(nbf=now + 3600, exp=now + 7200))
    t["wrong_iss"] = es256(claims(iss="https://evil.example"))
    t["wrong_aud"] = es256(claims(aud="someone-else"))
    t["unknown_kid"] = es256(claims(), kid="kid-not-in-set", key=stranger)

    # Change a leading signature character: the last one of an 86-character
    # segment carries 4 padding bits, so changing it may not change any byte.
    h, p, s = t["valid_es256"].split(".")
    t["bad_signature"] = f"{h}.{p}.{('B' if s[0] == 'A' else 'A') + s[1:]}"

    t["huge"] = es256(claims(pad="a" * 65536))
    # Overwrite (not insert) so the segment length stays decodable.
    t["bad_base64"] = f"{h}.{p[:8]}!!!{p[11:]}.{s}"

    ec_header = {"alg": "ES256", "typ": "JWT", "kid": "ec-1"}
    t["bad_json"] = es256_by_hand(ec_header, b'{"sub": "user-1", ', ec_key)
    dup = (
        f'{{"iss":{json.dumps(issuer)},"aud":{json.dumps(audience)},'
        f'"exp":{now + 600},"sub":"user-1","sub":"admin"}}'
    )
    t["duplicate_claims"] = es256_by_hand(ec_header, dup.encode(), ec_key)
    crit = {"alg": "ES256", "kid": "ec-1", "crit": ["exp-ext"], "exp-ext": 1}
    t["crit_header"] = es256_by_hand(crit, compact(claims()), ec_key)
    t["no_exp"] = es256(claims(exp=None))
    t["hs256_secret"] = jwt.encode(claims(), HS_SECRET, algorithm="HS256")

    (out / "jwks.json").write_text(json.dumps({"keys": jwks}, indent=2))
    (out / "rsa_public.pem").write_bytes(rsa_pem)
    (out / "hs_secret.txt").write_text(HS_SECRET)
    (out / "tokens.json").write_text(json.dumps(t, indent=2))


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: mint.py <dir> <issuer> <audience>", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    try:
        if not out.is_dir():
            raise RuntimeError(f"not a directory: {out}")
        mint(out, sys.argv[2], sys.argv[3])
    except Exception as e:
        print(f"mint.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
