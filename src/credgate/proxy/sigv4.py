"""AWS Signature Version 4 for the integrations that use it (Bedrock): botocore signs the exact request that
goes upstream, body included, with the stored access key; the secret access key itself never leaves credgate.

botocore is imported on the first signature, so a gateway without an AWS integration never pays for it.
"""

import logging
import re
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from credgate.errors import BadGateway
from credgate.key_shapes import aws_key_parts
from credgate.proxy.plan import UpstreamRequest
from credgate.specs import AwsSigV4Auth

# The client's own signature (made with its project token as the access key id): never relayed, since the
# signer sets its own, and a client's payload hash must not stand in for the hash of the bytes forwarded.
CLIENT_SIGNATURE_HEADERS = frozenset({"x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})


# An AWS region as it appears in a host name: us-east-1, eu-central-2, us-gov-west-1, ap-southeast-5.
_REGION = re.compile(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}")


def region_of(url: str) -> str | None:
    """The region named in an AWS endpoint's host (`bedrock-runtime.eu-west-1.amazonaws.com`), if any."""
    return next((label for label in (urlsplit(url).hostname or "").split(".") if _REGION.fullmatch(label)), None)


@cache
def _botocore() -> tuple[Any, Any, Any]:
    # botocore logs each canonical request at DEBUG, and with it a session token: never let that through.
    logging.getLogger("botocore").setLevel(logging.WARNING)
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    return SigV4Auth, AWSRequest, Credentials


def sign(plan: UpstreamRequest, body: bytes, *, spec: AwsSigV4Auth, key: str, provider: str) -> list[tuple[str, str]]:
    """The upstream headers with the SigV4 signature of `plan` and `body` (Authorization, X-Amz-Date and, for
    temporary credentials, X-Amz-Security-Token); BadGateway, naming no part of it, for a malformed stored key."""
    try:
        key_id, secret, session_token = aws_key_parts(key)
    except ValueError:
        raise BadGateway(
            f"{provider}: the stored key is not ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]; set it again"
        ) from None
    region = spec.region or region_of(plan.url)
    if region is None:
        raise BadGateway(f"{provider}: no AWS region in the base URL's host; set the auth's region")
    sigv4_auth, aws_request, credentials = _botocore()
    request = aws_request(method=plan.method, url=plan.url, data=body)
    for name, value in plan.headers:
        if name.lower() not in CLIENT_SIGNATURE_HEADERS:
            request.headers[name] = value  # appends: a repeated header stays repeated, as it is sent
    sigv4_auth(credentials(key_id, secret, session_token), spec.service, region).add_auth(request)
    return list(request.headers.items())
