"""The pure half of the data plane: token lookup, target checks, allow-list and the upstream request."""

import base64

import pytest

import credgate.proxy.plan as plan_module
from credgate.crypto import Secret
from credgate.errors import BadRequest, MethodNotAllowed
from credgate.paths import AllowList
from credgate.proxy.plan import (
    Headers,
    UpstreamRequest,
    check_method,
    check_target,
    find_token,
    plan_upstream,
    response_headers,
    split_target,
)
from credgate.resolved import ResolvedIntegration
from credgate.specs import AuthSpec, BasicAuth, BearerAuth, Endpoint, HeaderAuth, QueryAuth

TOKEN = "cgp_" + "t" * 43
KEY = "sk-provider-key-1234"
BASE_URL = "https://api.test/v1"


def resolved(
    auth: AuthSpec | None = None, headers: dict[str, str] | None = None, query: dict[str, str] | None = None
) -> ResolvedIntegration:
    return ResolvedIntegration(
        provider="openai",
        base_url=BASE_URL,
        auth=auth or BearerAuth(),
        endpoints=(),
        headers=headers or {},
        query=query or {},
        enabled=True,
        timeout_seconds=600.0,
        stream_idle_timeout_seconds=300.0,
        total_timeout_seconds=3600.0,
        credential=Secret(KEY),
    )


def plan(
    headers: Headers | None = None,
    *,
    query: bytes = b"",
    endpoint: str = "chat/completions",
    integration: ResolvedIntegration | None = None,
    method: str = "POST",
    credential: str = KEY,
) -> UpstreamRequest:
    return plan_upstream(
        method=method,
        raw_endpoint=endpoint,
        query_string=query,
        headers=headers or [],
        integration=integration or resolved(),
        credential=Secret(credential),
    )


def values(request: UpstreamRequest, name: str) -> list[str]:
    return [value for key, value in request.headers if key.lower() == name]


def names(request: UpstreamRequest) -> set[str]:
    return {key.lower() for key, _ in request.headers}


# the project token


@pytest.mark.parametrize("header", [b"authorization", b"x-api-key", b"api-key", b"x-goog-api-key", b"xi-api-key"])
def test_token_is_found_bare_in_every_sdk_header(header: bytes) -> None:
    assert find_token([(b"accept", b"*/*"), (header, TOKEN.encode())]) == TOKEN


@pytest.mark.parametrize("value", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Token {TOKEN}"])
def test_token_is_found_after_a_scheme(value: str) -> None:
    assert find_token([(b"authorization", value.encode())]) == TOKEN


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"authorization", b"Bearer sk-not-a-project-token")],
        [(b"authorization", b"Basic " + base64.b64encode(TOKEN.encode()))],
        [(b"x-custom-key", TOKEN.encode())],
        [(b"cookie", f"token={TOKEN}".encode())],
    ],
)
def test_no_token_outside_the_credential_headers(headers: Headers) -> None:
    assert find_token(headers) is None


def test_token_is_found_whichever_credential_header_comes_first() -> None:
    headers = [(b"authorization", b"Bearer sk-other"), (b"x-api-key", TOKEN.encode())]
    assert find_token(headers) == TOKEN


# the target


def test_split_target_keeps_the_endpoint_encoded() -> None:
    assert split_target(b"/proxy/openai/files/a%20b/content") == ("openai", "files/a%20b/content")
    assert split_target(b"/proxy/openai") == ("openai", "")


def test_check_target_decodes_segments() -> None:
    assert check_target("openai", "chat/completions") == ("chat", "completions")
    assert check_target("my_provider-2", "files/a%20b") == ("files", "a b")


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "..",
        "v1/../admin",
        "v1/%2e%2e/admin",
        "v1/%2E%2E/admin",
        "v1/.%2e/admin",
        ".",
        "v1/%2e/x",
        "a%2Fb",
        "a%2fb",
        "a%5Cb",
        "a%5cb",
        "a\\b",
        "a//b",
        "/a",
        "http://evil.test/x",
        "https:%2F%2Fevil.test",
        "a%3Fb",
        "a%23b",
        "a%00b",
    ],
)
def test_check_target_rejects_an_endpoint_that_could_leave_the_base_path(endpoint: str) -> None:
    with pytest.raises(BadRequest):
        check_target("openai", endpoint)


@pytest.mark.parametrize("provider", ["", "OpenAI", "-openai", "_x", "open.ai", "op%65nai", "a" * 64, "a b"])
def test_check_target_rejects_bad_provider_names(provider: str) -> None:
    with pytest.raises(BadRequest):
        check_target(provider, "chat/completions")


# the allow-list


def allowed(method: str, path: str, *rules: tuple[str, str]) -> bool:
    endpoints = [Endpoint(method=rule_method, path=rule_path) for rule_method, rule_path in rules]
    return AllowList(endpoints).admits(method, tuple(path.split("/")))


def test_exact_endpoint_and_method() -> None:
    rule = ("POST", "chat/completions")
    assert allowed("POST", "chat/completions", rule)
    assert not allowed("GET", "chat/completions", rule)
    assert not allowed("POST", "chat", rule)
    assert not allowed("POST", "chat/completions/x", rule)
    assert not allowed("POST", "chat/completion", rule)


def test_method_star_allows_any_method() -> None:
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        assert allowed(method, "files", ("*", "files"))


def test_star_matches_exactly_one_segment() -> None:
    rule = ("GET", "files/*/content")
    assert allowed("GET", "files/f1/content", rule)
    assert not allowed("GET", "files/f1/f2/content", rule)
    assert not allowed("GET", "files/content", rule)


def test_double_star_matches_any_remaining_segments() -> None:
    rule = ("*", "echo/**")
    assert allowed("PUT", "echo/a", rule)
    assert allowed("PUT", "echo/a/b/c/d", rule)
    assert not allowed("PUT", "other/a", rule)


def test_no_endpoints_allow_nothing() -> None:
    assert not allowed("GET", "anything")


# the upstream request


def test_url_joins_the_endpoint_under_the_base_path_as_written() -> None:
    assert plan(endpoint="files/a%20b/content").url == f"{BASE_URL}/files/a%20b/content"


HOP_BY_HOP = [
    (b"connection", b"keep-alive, x-hop"),
    (b"keep-alive", b"timeout=5"),
    (b"x-hop", b"1"),
    (b"te", b"trailers"),
    (b"trailer", b"x-sum"),
    (b"transfer-encoding", b"chunked"),
    (b"upgrade", b"websocket"),
    (b"proxy-authorization", b"Basic eDp5"),
    (b"proxy-connection", b"keep-alive"),
]
PRIVATE = [
    (b"authorization", f"Bearer {TOKEN}".encode()),
    (b"x-api-key", TOKEN.encode()),
    (b"api-key", TOKEN.encode()),
    (b"x-goog-api-key", TOKEN.encode()),
    (b"xi-api-key", TOKEN.encode()),
    (b"cookie", b"session=abc"),
    (b"forwarded", b"for=10.0.0.1"),
    (b"x-forwarded-for", b"10.0.0.1"),
    (b"x-forwarded-host", b"gateway.test"),
    (b"x-forwarded-proto", b"https"),
    (b"x-real-ip", b"10.0.0.1"),
    (b"host", b"gateway.test"),
]
END_TO_END = [
    (b"content-type", b"application/json"),
    (b"accept", b"text/event-stream"),
    (b"accept-encoding", b"gzip"),
    (b"user-agent", b"OpenAI/Python 1.0"),
    (b"openai-organization", b"org-1"),
    (b"anthropic-version", b"2023-06-01"),
    (b"x-stainless-retry-count", b"0"),
]


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    sent = names(plan(HOP_BY_HOP + END_TO_END))
    assert sent.isdisjoint(name.decode() for name, _ in HOP_BY_HOP)


def test_a_header_named_by_connection_is_dropped_wherever_it_comes() -> None:
    headers = [(b"x-before", b"1"), (b"Connection", b"X-Before"), (b"x-after", b"2"), (b"connection", b"x_after")]
    integration = resolved(headers={"X-Before": "default", "X-Kept": "default"})
    request = plan([*headers, *END_TO_END], integration=integration)
    assert names(request) == {"authorization", "x-kept", *(name.decode() for name, _ in END_TO_END)}


def test_credentials_cookies_and_the_clients_address_are_dropped() -> None:
    request = plan(PRIVATE + END_TO_END)
    assert names(request).isdisjoint(name.decode() for name, _ in PRIVATE if name != b"authorization")
    assert values(request, "authorization") == [f"Bearer {KEY}"]
    assert TOKEN not in repr(request)


def test_end_to_end_headers_are_kept_in_order() -> None:
    request = plan(HOP_BY_HOP + PRIVATE + END_TO_END)
    kept = [(name, value) for name, value in request.headers if name.lower() != "authorization"]
    assert kept == [(name.decode(), value.decode()) for name, value in END_TO_END]


def test_default_headers_are_added_unless_the_client_sent_them() -> None:
    integration = resolved(headers={"OpenAI-Beta": "assistants=v2", "X-Team": "ml"})
    request = plan([(b"openai-beta", b"assistants=v1")], integration=integration)
    assert values(request, "openai-beta") == ["assistants=v1"]
    assert values(request, "x-team") == ["ml"]


def test_default_query_is_added_unless_the_client_sent_it() -> None:
    integration = resolved(query={"api-version": "2024-06-01", "region": "eu"})
    assert plan(query=b"api-version=2023-01-01", integration=integration).url.endswith(
        "?api-version=2023-01-01&region=eu"
    )
    assert plan(integration=integration).url.endswith("?api-version=2024-06-01&region=eu")


def test_default_query_values_are_encoded() -> None:
    integration = resolved(query={"a b": "c&d=e"})
    assert plan(integration=integration).url == f"{BASE_URL}/chat/completions?a%20b=c%26d%3De"


@pytest.mark.parametrize(
    ("auth", "header", "expected"),
    [
        (BearerAuth(), "authorization", f"Bearer {KEY}"),
        (HeaderAuth(method="header", name="X-Custom-Key"), "x-custom-key", KEY),
        (HeaderAuth(method="header", name="Authorization", prefix="Token "), "authorization", f"Token {KEY}"),
        (HeaderAuth(method="header", name="x-api-key"), "x-api-key", KEY),
        (BasicAuth(method="basic"), "authorization", "Basic " + base64.b64encode(KEY.encode()).decode()),
    ],
)
def test_credential_is_placed_once_over_the_clients_copy(auth: AuthSpec, header: str, expected: str) -> None:
    client = [(b"authorization", f"Bearer {TOKEN}".encode()), (header.encode(), b"client-value"), *END_TO_END]
    assert values(plan(client, integration=resolved(auth)), header) == [expected]


def test_query_credential_is_placed_once_over_the_clients_copy() -> None:
    integration = resolved(QueryAuth(method="query", name="key"), query={"key": "default"})
    request = plan(query=b"a=1&key=client&b=2&key=again", integration=integration)
    assert request.url == f"{BASE_URL}/chat/completions?a=1&b=2&key={KEY}"
    assert "authorization" not in names(request)


def test_query_credential_is_encoded() -> None:
    integration = resolved(QueryAuth(method="query", name="key"))
    request = plan(endpoint="models", integration=integration, credential="a+b/c=d&e")
    assert request.url == f"{BASE_URL}/models?key=a%2Bb%2Fc%3Dd%26e"


@pytest.mark.parametrize(
    "query",
    [
        b"a=1&a=2&a=3",
        b"q=hello+world&r=hello%20world",
        b"path=%2Fetc%2Fpasswd&x=%E2%9C%93",
        b"flag&empty=&eq=a=b",
        b"filter[name]=x&sort=-created_at",
        b"A=1&a=2",
        b"semi=1;2&pct=%25",
        b"x=1&&y=2&",
    ],
)
def test_query_string_is_forwarded_verbatim(query: bytes) -> None:
    assert plan(query=query).url == f"{BASE_URL}/chat/completions?{query.decode()}"


def test_no_query_means_no_question_mark() -> None:
    assert plan().url == f"{BASE_URL}/chat/completions"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_method_is_kept(method: str) -> None:
    assert plan(method=method).method == method


# the response


def test_response_headers_drop_hop_by_hop_and_keep_content_encoding() -> None:
    upstream = [
        (b"Content-Type", b"application/json"),
        (b"Content-Encoding", b"gzip"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"Keep-Alive", b"timeout=5"),
        (b"X-Hop", b"1"),
        (b"Retry-After", b"20"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
    ]
    assert response_headers(upstream) == [
        (b"Content-Type", b"application/json"),
        (b"Content-Encoding", b"gzip"),
        (b"Retry-After", b"20"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
    ]


def test_a_response_header_named_by_connection_is_dropped_wherever_it_comes() -> None:
    upstream = [(b"X-Early", b"1"), (b"A", b"1"), (b"Connection", b"x-early, keep-alive"), (b"Connection", b"X-Late")]
    assert response_headers([*upstream, (b"X-Late", b"2"), (b"B", b"2")]) == [(b"A", b"1"), (b"B", b"2")]


def test_made_up_header_names_cannot_grow_the_remembered_names_nor_change_a_rule() -> None:
    flood = [(f"x-made-up-{number}".encode(), b"1") for number in range(3000)]
    plan_module._canonical.clear()
    response_headers([(b"x-" + b"long" * 10_000, b"1"), *flood])
    assert all(len(name) <= 64 for name in plan_module._canonical)
    upstream = plan([*flood, (b"X_Api_Key", TOKEN.encode()), (b"Connection", b"x-made-up-2999")])
    assert len(plan_module._canonical) <= 1024
    assert "x_api_key" not in names(upstream)
    assert "x-made-up-2999" not in names(upstream)
    assert len(upstream.headers) == 3000  # the rest of the flood, and the key placed


# Regressions from the security review.


def test_a_trailing_slash_is_kept_and_matches_a_wildcard() -> None:
    assert check_target("openai", "items/") == ("items", "")
    assert AllowList([Endpoint(method="GET", path="items/*")]).admits("GET", ("items", ""))
    assert not AllowList([Endpoint(method="GET", path="items")]).admits("GET", ("items", ""))


def test_a_default_header_named_like_the_credential_is_not_sent_too() -> None:
    request = plan(integration=resolved(headers={"Authorization": "Bearer a-default"}))
    assert [value for name, value in request.headers if name.lower() == "authorization"] == [f"Bearer {KEY}"]


@pytest.mark.parametrize("name", ["Host", "transfer-encoding", "Content-Length", "Connection"])
def test_a_key_may_not_be_placed_in_a_header_the_transport_owns(name: str) -> None:
    with pytest.raises(ValueError, match="cannot carry the key"):
        HeaderAuth(method="header", name=name)


def test_a_query_key_is_cut_out_of_urls_the_upstream_quotes_back() -> None:
    request = plan(integration=resolved(auth=QueryAuth(method="query", name="key")))
    assert request.query_secrets == (KEY, KEY)  # as written and encoded (the same for this key)
    relayed = response_headers(
        [(b"Location", f"https://api.test/v1/next?key={KEY}".encode()), (b"X-Other", KEY.encode())],
        secrets=request.query_secrets,
    )
    assert relayed == [(b"Location", b"https://api.test/v1/next?key=REDACTED"), (b"X-Other", KEY.encode())]


def test_an_upstream_cannot_pass_for_credgate() -> None:
    relayed = response_headers([(b"X-Credgate-Error", b"true"), (b"x-credgate-request-id", b"x"), (b"A", b"1")])
    assert relayed == [(b"A", b"1")]


@pytest.mark.parametrize(
    "name", [b"x_api_key", b"X_Api_Key", b"api_key", b"x_goog_api_key", b"xi_api_key", b"proxy_authorization"]
)
def test_a_credential_header_spelled_with_underscores_never_goes_upstream(name: bytes) -> None:
    upstream = plan([(name.lower(), b"attacker"), (b"authorization", f"Bearer {TOKEN}".encode())])
    assert all(value != "attacker" for _, value in upstream.headers)
    assert [value for name, value in upstream.headers if name.lower() == "authorization"] == [f"Bearer {KEY}"]


def test_a_token_under_an_underscore_spelling_is_found() -> None:
    assert find_token([(b"x_api_key", TOKEN.encode())]) == TOKEN


def test_underscore_spellings_of_hop_by_hop_and_forwarding_headers_are_dropped() -> None:
    upstream = plan([(b"transfer_encoding", b"chunked"), (b"x_forwarded_for", b"10.0.0.1"), (b"x_ok", b"1")])
    assert upstream.headers[:-1] == [("x_ok", "1")]


def test_a_connection_header_naming_the_credential_cannot_remove_it() -> None:
    upstream = plan([(b"connection", b"keep-alive, Authorization, x_custom"), (b"x-custom", b"1")])
    assert upstream.headers == [("Authorization", f"Bearer {KEY}")]


def test_the_project_token_goes_nowhere_else_the_client_put_it() -> None:
    headers: Headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"x-echo", f"copy {TOKEN}".encode())]
    upstream = plan_upstream(
        method="GET",
        raw_endpoint="models",
        query_string=f"a=1&t={TOKEN}&b=%63gp_{TOKEN[4:]}&c=2".encode(),
        headers=headers,
        integration=resolved(),
        credential=Secret(KEY),
        client_token=TOKEN,
    )
    assert TOKEN[4:] not in upstream.url + repr(upstream.headers)
    assert upstream.url == f"{BASE_URL}/models?a=1&c=2"


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "PROPFIND", "MKCOL", "LOCK", "BREW"])
def test_a_method_the_proxy_never_forwards_gets_405_with_allow(method: str) -> None:
    with pytest.raises(MethodNotAllowed) as refusal:
        check_method(method)
    assert refusal.value.headers == {"Allow": "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"}


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
def test_forwardable_methods_pass_the_method_check(method: str) -> None:
    check_method(method)


def test_a_credgate_token_wins_over_a_jwt_of_another_service() -> None:
    jwt_like = b"Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    assert find_token([(b"authorization", jwt_like), (b"x-api-key", TOKEN.encode())]) == TOKEN
    assert find_token([(b"authorization", jwt_like)]) == jwt_like[len(b"Bearer ") :].decode()
