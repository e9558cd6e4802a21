"""Google service accounts for the tests: a fresh RSA key, its JSON key file as Google downloads it, and a
self-signed certificate, which is what Google publishes for a service account's key and what google-auth
verifies a JWT with. Every key file and private key is registered with the secret sweep."""

import asyncio
import datetime
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import jwt

from tests.secret_sweep import SWEEP


@dataclass(frozen=True)
class ServiceAccount:
    key_file: str  # the JSON key file, the integration's stored key
    private_key_pem: str
    certificate_pem: str
    key_id: str
    client_email: str

    @property
    def certs(self) -> dict[str, str]:
        """What Google publishes for the account: its keys' certificates by key id."""
        return {self.key_id: self.certificate_pem}

    def decode(self, assertion: str, *, audience: str) -> dict[str, Any]:
        """The assertion's claims, its signature, audience and times verified by google-auth (ValueError if not)."""
        claims: dict[str, Any] = jwt.decode(assertion, certs=self.certs, audience=audience)  # type: ignore[no-untyped-call]
        return claims


def new_service_account(*, project_id: str = "credgate-tests", key_id: str | None = None) -> ServiceAccount:
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_key_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    client_email = f"gateway-{secrets.token_hex(4)}@{project_id}.iam.gserviceaccount.com"
    key_id = key_id or secrets.token_hex(20)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, client_email)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private_key, hashes.SHA256())
    )
    key_file = json.dumps(
        {
            "type": "service_account",
            "project_id": project_id,
            "private_key_id": key_id,
            "private_key": private_key_pem,
            "client_email": client_email,
            "client_id": str(secrets.randbelow(10**20)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": "https://oauth2.googleapis.com/token",
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{client_email}",
            "universe_domain": "googleapis.com",
        },
        indent=2,  # as Google's download is: line breaks and indentation
    )
    for secret in (key_file, private_key_pem, _first_body_line(private_key_pem)):
        SWEEP.register(secret)
    return ServiceAccount(
        key_file=key_file,
        private_key_pem=private_key_pem,
        certificate_pem=certificate.public_bytes(serialization.Encoding.PEM).decode(),
        key_id=key_id,
        client_email=client_email,
    )


JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"


@dataclass
class GoogleTokenEndpoint:
    """Google's token endpoint for service accounts: it verifies the JWT bearer grant's assertion with the
    certificates of the accounts it knows, and refuses anything else with 400 invalid_grant, as Google does."""

    accounts: list[ServiceAccount]
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)  # every request, as received
    grants: list[dict[str, Any]] = field(default_factory=list)  # the verified claims of each accepted assertion
    headers: list[dict[str, Any]] = field(default_factory=list)  # and their JWT headers
    issued: list[str] = field(default_factory=list)  # the access tokens handed out
    refused: list[str] = field(default_factory=list)  # why each refused request was refused
    delay: float = 0.0  # seconds before answering

    def verify(self, form: dict[str, str]) -> dict[str, Any]:
        if set(form) != {"grant_type", "assertion"} or form["grant_type"] != JWT_BEARER_GRANT:
            raise ValueError("not a JWT bearer grant")
        certs = {account.key_id: account.certificate_pem for account in self.accounts}
        claims: dict[str, Any] = jwt.decode(form["assertion"], certs=certs, audience=self.url)  # type: ignore[no-untyped-call]
        header: dict[str, Any] = jwt.decode_header(form["assertion"])  # type: ignore[no-untyped-call]
        account = next(account for account in self.accounts if account.key_id == header["kid"])
        if claims.get("iss") != account.client_email or not claims.get("scope"):
            raise ValueError("the issuer is not the key's account, or no scope")
        self.headers.append(header)
        return claims


@asynccontextmanager
async def run_google_token_endpoint(*accounts: ServiceAccount) -> AsyncIterator[GoogleTokenEndpoint]:
    """The stand-in at `/token` (Google's path), on a free port of loopback."""
    state = GoogleTokenEndpoint(accounts=list(accounts))

    async def token(request: web.Request) -> web.Response:
        body = await request.read()
        state.bodies.append(body)
        await asyncio.sleep(state.delay)
        if request.content_type != "application/x-www-form-urlencoded":
            state.refused.append("not a form")
            return web.json_response({"error": "invalid_request"}, status=400)
        try:
            claims = state.verify({name: str(value) for name, value in (await request.post()).items()})
        except (ValueError, KeyError, StopIteration) as error:
            state.refused.append(str(error))
            refusal = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            return web.json_response(refusal, status=400)
        state.grants.append(claims)
        access_token = "ya29.c." + secrets.token_urlsafe(32)
        SWEEP.register(access_token)  # the client never sees it, and no log holds it
        state.issued.append(access_token)
        return web.json_response({"access_token": access_token, "expires_in": 3599, "token_type": "Bearer"})

    app = web.Application()
    app.router.add_post("/token", token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/token"
    try:
        yield state
    finally:
        await runner.cleanup()


def _first_body_line(pem: str) -> str:
    """A part of the key, so a leak of a piece of it (not the whole PEM) is found too."""
    return pem.splitlines()[1]
