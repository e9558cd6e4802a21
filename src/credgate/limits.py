"""The limits of what an admin may configure, each defined once: ranges, lengths and counts.

The services enforce them whatever the front end (`within`), and answer InvalidInput naming the field, never the
value. The admin API's schemas declare the same types, so its OpenAPI document shows the ranges; the panel and
the CLI read typed text into them (`parse`). The ranges also keep date arithmetic far from overflowing.
"""

import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar, cast

from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from pydantic import AfterValidator, AwareDatetime, Field, TypeAdapter, ValidationError

from credgate.errors import InvalidInput

T = TypeVar("T")

MAX_TIMEOUT_SECONDS = 3600
MAX_TOTAL_TIMEOUT_SECONDS = 86400  # a day: long enough for any stream a client would wait for
MAX_GRACE = timedelta(days=30)
MAX_TOKEN_LIFETIME = timedelta(days=3650)
MAX_USAGE_WINDOW = timedelta(days=3650)
MAX_RATE_LIMIT_PER_MINUTE = 1_000_000
MAX_CONCURRENT_REQUESTS = 100_000
MAX_LISTED = 1000  # records in one answer of the request log or the audit log
MAX_NAME_LENGTH = 200
MAX_PROVIDER_NAME_LENGTH = 63  # a DNS label's length: a provider name is a path segment, and reads like a host
MAX_TEMPLATE_ID_LENGTH = 100
MAX_KEY_LABEL_LENGTH = 64  # an admin's name for one key of a pool ("primary", "team-b account")
MAX_KEYS_PER_INTEGRATION = 20
MAX_URL_LENGTH = 2048
MAX_KEY_LENGTH = 8192
MAX_ACTOR_LENGTH = 200  # the audit log's "who": a kind of actor and a name, cut to this length
MAX_ENDPOINTS = 1000
MAX_PRIVATE_NETWORKS = 32  # an integration's exceptions to the SSRF guard: a few hosts or networks, not a routing table
MAX_ALLOWED_ORIGINS = 100  # a project's web origins: its sites, not every page of the web
MIN_PASSWORD_LENGTH = 12
MAX_SUBJECT_LENGTH = 200  # an end user's id, as an identity token or a client token's minter names it
# A subject ends up in logs and headers: no line breaks, control, invisible-format or lone-surrogate characters.
_UNSAFE_SUBJECT_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Times an admin may name (a usage window): far enough from datetime's own ends that no offset or window
# arithmetic can leave its range.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _check_text(text: str) -> str:
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 or 0xD800 <= ord(char) < 0xE000 for char in text):
        raise ValueError("may not hold control characters, line breaks or unpaired surrogates")
    return text


def check_subject(subject: str) -> str:
    """An end user's id as credgate records it, whoever names it (an identity token, a client token's minter)."""
    if len(subject) > MAX_SUBJECT_LENGTH or any(
        unicodedata.category(char) in _UNSAFE_SUBJECT_CATEGORIES for char in subject
    ):
        raise ValueError(f"must be at most {MAX_SUBJECT_LENGTH} characters, without control or invisible ones")
    return subject


def _check_moment(moment: datetime) -> datetime:
    # Compared by year first: converting a time near datetime's ends to UTC could itself overflow.
    if not EARLIEST.year < moment.year < LATEST.year or not EARLIEST <= moment <= LATEST:
        raise ValueError(f"must be between {EARLIEST.date()} and {LATEST.date()}")
    return moment


# Numbers. Whole numbers of seconds where a second is fine enough; timeouts may be fractions.
TimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)]
StreamIdleTimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)]
TotalTimeoutSeconds = Annotated[float, Field(gt=0, le=MAX_TOTAL_TIMEOUT_SECONDS, allow_inf_nan=False)]
GraceSeconds = Annotated[int, Field(ge=0, le=int(MAX_GRACE.total_seconds()))]
ExpiresInSeconds = Annotated[int, Field(ge=1, le=int(MAX_TOKEN_LIFETIME.total_seconds()))]
ExpiresInDays = Annotated[int, Field(ge=1, le=MAX_TOKEN_LIFETIME.days)]  # the panel's and `--days` unit
RateLimitPerMinute = Annotated[int, Field(ge=1, le=MAX_RATE_LIMIT_PER_MINUTE)]
ConcurrentRequests = Annotated[int, Field(ge=1, le=MAX_CONCURRENT_REQUESTS)]
KeyMaxAgeDays = Annotated[int, Field(ge=1, le=MAX_TOKEN_LIFETIME.days)]
ListLimit = Annotated[int, Field(ge=1, le=MAX_LISTED)]
UsageDays = Annotated[int, Field(ge=1, le=MAX_USAGE_WINDOW.days)]

# Text.
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH), AfterValidator(_check_text)]
TemplateId = Annotated[str, Field(min_length=1, max_length=MAX_TEMPLATE_ID_LENGTH)]
Password = Annotated[str, Field(min_length=MIN_PASSWORD_LENGTH)]

# Times.
Moment = Annotated[AwareDatetime, AfterValidator(_check_moment)]

_adapters: dict[int, tuple[object, TypeAdapter[Any]]] = {}


def _adapter(kind: object) -> TypeAdapter[Any]:
    found = _adapters.get(id(kind))
    if found is None:
        found = _adapters[id(kind)] = (kind, TypeAdapter(cast(Any, kind)))
    return found[1]


def _bounds(kind: object) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for part in getattr(kind, "__metadata__", ()):
        for constraint in getattr(part, "metadata", ()):
            match constraint:
                case Ge(ge=low) | Gt(gt=low):
                    found["low"], found["open"] = low, isinstance(constraint, Gt)
                case Le(le=high):
                    found["high"] = high
                case MinLen(min_length=shortest):
                    found["shortest"] = shortest
                case MaxLen(max_length=longest):
                    found["longest"] = longest
    return found


def describe(kind: object) -> str:
    """What `kind` accepts, in words: "a whole number from 1 to 1000", "1 to 200 characters"."""
    bounds = _bounds(kind)
    base = getattr(kind, "__origin__", kind)
    if base is str:
        if "longest" not in bounds:
            return f"at least {bounds.get('shortest', 0)} characters"
        return f"{bounds.get('shortest', 0)} to {bounds['longest']} characters"
    if base is list or getattr(base, "__origin__", None) is list:
        return f"a list of at most {bounds['longest']} entries" if "longest" in bounds else "a list"
    if base is AwareDatetime:
        return f"an RFC 3339 time with a zone offset, between {EARLIEST.date()} and {LATEST.date()}"
    noun = "a whole number" if base is int else "a number"
    if "low" in bounds and "high" in bounds:
        if bounds["open"]:
            return f"{noun} above {bounds['low']}, at most {bounds['high']}"
        return f"{noun} from {bounds['low']} to {bounds['high']}"
    return noun


def _invalid(field: str, kind: object, error: ValidationError) -> InvalidInput:
    # A validator's own words where it has some (they never quote the value), else what the type accepts.
    first = error.errors(include_input=False)[0]
    if first["type"] == "value_error":
        return InvalidInput(field, str(first["msg"]).removeprefix("Value error, "))
    return InvalidInput(field, f"must be {describe(kind)}")


def within(field: str, kind: object, value: T) -> T:
    """`value` when it is a `kind` (one of the types above); InvalidInput naming `field` otherwise.

    Strict: a service takes numbers as numbers, so a bool or a string is refused rather than read.
    """
    try:
        checked: T = _adapter(kind).validate_python(value, strict=True)
    except ValidationError as error:
        raise _invalid(field, kind, error) from None
    return checked


def _parse(field: str, kind: object, text: str) -> Any:
    try:
        return _adapter(kind).validate_python(text.strip())
    except ValidationError as error:
        raise _invalid(field, kind, error) from None


def parse_int(field: str, kind: object, text: str) -> int:
    """Typed text (a form field, an option) read as a whole-number `kind`; InvalidInput naming `field` otherwise."""
    value: int = _parse(field, kind, text)
    return value


def parse_float(field: str, kind: object, text: str) -> float:
    """Typed text read as a number `kind` (NaN, infinities and overflowing exponents are out of every range)."""
    value: float = _parse(field, kind, text)
    return value
