"""ES256 tokens for the JWT benchmark: writes DIR/jwks.json (one P-256 key, kid "bench"), DIR/token
(one token, valid for an hour) and DIR/uris (COUNT targets /bytes/1k?access_token=..., each with a
token of its own). Needs the `cryptography` package."""

import base64
import json
import sys
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main() -> None:
    out, count = sys.argv[1], int(sys.argv[2])
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_numbers()
    jwk = {"kty": "EC", "crv": "P-256", "kid": "bench", "use": "sig", "alg": "ES256",
           "x": b64(pub.x.to_bytes(32, "big")), "y": b64(pub.y.to_bytes(32, "big"))}
    with open(f"{out}/jwks.json", "w") as f:
        json.dump({"keys": [jwk]}, f)
    head = b64(json.dumps({"alg": "ES256", "typ": "JWT", "kid": "bench"}).encode())
    exp = int(time.time()) + 3600

    def token(n: int) -> str:
        claims = {"iss": "https://id.bench", "aud": "api", "sub": f"user-{n}", "exp": exp}
        signing_input = f"{head}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    with open(f"{out}/token", "w") as f:
        f.write(token(0))
    with open(f"{out}/uris", "w") as f:
        for n in range(1, count + 1):
            f.write(f"/bytes/1k?access_token={token(n)}\n")


if __name__ == "__main__":
    main()
