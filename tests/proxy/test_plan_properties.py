"""Properties of the pure proxy plan over generated requests (Hypothesis): whatever the method, path, query and
headers, the upstream URL stays under the base path, the credential is placed exactly once, and neither a
client credential (in any spelling) nor the project token goes upstream."""

import base64
from urllib.parse import unquote, urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st

from credgate.crypto import Secret
from credgate.errors import BadRequest
from credgate.paths import parse_path
from credgate.proxy.plan import canonical_header, check_target, plan_upstream
from credgate.specs import AuthSpec, BasicAuth, BearerAuth, HeaderAuth, QueryAuth
from tests.proxy.test_plan import BASE_URL, KEY, TOKEN, resolved

CLIENT_SECRET = "attacker-secret-9f8e"
CREDENTIAL_NAMES = ["authorization", "x-api-key", "api-key", "x-goog-api-key", "xi-api-key", "proxy-authorization"]
AUTHS: list[tuple[AuthSpec, str]] = [
    (BearerAuth(), f"Bearer {KEY}"),
    (HeaderAuth(method="header", name="x-api-key"), KEY),
    (HeaderAuth(method="header", name="Authorization", prefix="Token "), f"Token {KEY}"),
    (BasicAuth(method="basic"), "Basic " + base64.b64encode(KEY.encode()).decode()),
    (QueryAuth(method="query", name="key"), KEY),
]


def spellings(name: str) -> st.SearchStrategy[bytes]:
    """A header name as a client might write it: any case, `-` or `_` (uvicorn lowercases names)."""
    variants = st.lists(st.sampled_from(["-", "_"]), min_size=name.count("-"), max_size=name.count("-"))

    def spell(separators: list[str]) -> bytes:
        parts = name.split("-")
        return (parts[0] + "".join(sep + part for sep, part in zip(separators, parts[1:], strict=True))).encode()

    return variants.map(spell)


header_values = st.one_of(
    st.just(CLIENT_SECRET.encode()),
    st.just(f"Bearer {CLIENT_SECRET}".encode()),
    st.just(TOKEN.encode()),
    st.just(f"Bearer {TOKEN}".encode()),
    st.binary(max_size=20).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")),
)
credential_headers = (
    st.sampled_from(CREDENTIAL_NAMES).flatmap(spellings).flatmap(lambda name: st.tuples(st.just(name), header_values))
)
other_headers = st.tuples(
    st.from_regex(r"[a-z][a-z0-9_-]{0,15}", fullmatch=True).map(str.encode),
    header_values,
)
connection_headers = st.lists(st.sampled_from([*CREDENTIAL_NAMES, "x-custom", "keep-alive"]), max_size=3).map(
    lambda names: (b"connection", ", ".join(names).encode())
)
headers_strategy = st.lists(st.one_of(credential_headers, other_headers, connection_headers), max_size=12)
segment_text = st.one_of(
    st.sampled_from(["..", ".", "%2e%2e", "..;x", "%2F", "%5C", "", "a", "models", "%3b", "%zz", "%00", "...", "a b"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="/?#"), max_size=6),
)
paths = st.lists(segment_text, min_size=1, max_size=6).map("/".join)
queries = st.one_of(
    st.just(b""),
    st.lists(
        st.sampled_from(["a=1", f"key={CLIENT_SECRET}", f"t={TOKEN}", f"x=%63gp_{TOKEN[4:]}", "", "k=%zz"]),
        max_size=4,
    ).map(lambda pairs: "&".join(pairs).encode()),
)


@settings(max_examples=400, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
    raw_endpoint=paths,
    query=queries,
    headers=headers_strategy,
    auth=st.sampled_from(AUTHS),
)
def test_any_request_plans_under_the_base_path_with_one_credential_and_no_client_secret(
    method: str, raw_endpoint: str, query: bytes, headers: list[tuple[bytes, bytes]], auth: tuple[AuthSpec, str]
) -> None:
    spec, placed = auth
    try:
        check_target("openai", raw_endpoint)
    except BadRequest:
        return  # refused before any planning: nothing goes upstream
    upstream = plan_upstream(
        method=method,
        raw_endpoint=raw_endpoint,
        query_string=query,
        headers=headers,
        integration=resolved(auth=spec),
        credential=Secret(KEY),
        client_token=TOKEN,
    )
    url = urlsplit(upstream.url)
    assert upstream.url.startswith(BASE_URL + "/")
    assert parse_path(url.path.removeprefix("/v1/")) == parse_path(raw_endpoint)

    sent = repr(upstream.headers) + unquote(upstream.url)
    assert TOKEN[4:] not in sent, "the project token went upstream"
    credential_headers = [
        (name, value) for name, value in upstream.headers if canonical_header(name.encode()) in CREDENTIAL_SET
    ]
    assert CLIENT_SECRET not in repr(credential_headers), "a client credential went upstream"
    if isinstance(spec, QueryAuth):
        assert unquote(url.query).count(f"key={KEY}") == 1
        assert f"key={CLIENT_SECRET}" not in unquote(url.query)
        assert credential_headers == []
    else:
        assert [value for _, value in credential_headers] == [placed]
        assert sent.count(placed) == 1


CREDENTIAL_SET = frozenset(name.encode() for name in CREDENTIAL_NAMES)
