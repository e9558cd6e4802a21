"""Validation messages as the integration pages show them: one sentence per problem, naming the field by its
label (`The header name is required.`), rows and lines counted from 1, and never a submitted value (a key pasted
into the wrong field must not come back in an error)."""

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from credgate.errors import InvalidInput

# Raw problems reworded where the raw words would puzzle an admin.
_REWORDED = {
    "is not a valid HTTP header name": "may hold only letters, digits and !#$%&'*+-.^_`|~ (no space or colon)",
}
# A problem beginning with one of these names its own subject (`header Host is set by …`, `port 0 is not …`) and
# stands alone; any other reads after its field's label (`must …`, `reaches …`).
_OWN_SUBJECT = ("header ", "a ", "an ", "the ", "'", "port ", "entry ", "basic ")
# The auth spec's fields: (method, field) or field → (the form field showing the error, its label).
_AUTH_FIELDS: dict[tuple[str, str] | str, tuple[str, str]] = {
    ("header", "name"): ("auth_name", "the header name"),
    ("query", "name"): ("auth_name", "the parameter name"),
    "prefix": ("auth_prefix", "the prefix"),
    "token_url": ("token_url", "the token URL"),
    "client_id": ("client_id", "the client ID"),
    "scope": ("scope", "the scope"),
    "audience": ("audience", "the audience"),
    "client_auth": ("client_auth", "the client authentication"),
    "region": ("region", "the region"),
    "service": ("service", "the service"),
}
_AUTH_METHOD = ("auth_method", "the authentication method")
# A service's field name (InvalidInput.field) → the form field that shows it, where the two differ.
_SERVICE_FIELDS = {"auth": "auth_method", "auth.token_url": "token_url"}


def sentence(label: str | None, problem: str, *, where: str | None = None) -> str:
    """`the base URL` + `must start with …` → `The base URL must start with ….`. A problem naming its own
    subject (`header Host is set by …`) stands alone; `a header value may not …` reads as the label's. With
    `where` (`Row 2`), the sentence follows it: `Row 2: the path may not ….`"""
    problem = _REWORDED.get(problem, problem).rstrip(".")
    if label is not None and problem.startswith("a header value "):
        problem = problem.removeprefix("a header value ")
    text = problem if label is None or problem.startswith(_OWN_SUBJECT) else f"{label} {problem}"
    if where is not None:
        return f"{where}: {text}."
    return f"{text[:1].upper()}{text[1:]}."


def problem_of(error: ErrorDetails) -> str:
    """What is wrong, in words that follow a label: `is required`, `must be at most 64 characters`."""
    kind, context = error["type"], error.get("ctx") or {}
    if kind == "missing" or (kind == "string_too_short" and context.get("min_length") == 1):
        return "is required"
    if kind == "string_too_short":
        return f"must be at least {context['min_length']} characters"
    if kind == "string_too_long":
        return f"must be at most {context['max_length']} characters"
    if kind == "too_long":
        return f"may hold at most {context['max_length']} entries"
    if kind == "literal_error":
        return f"must be {context['expected']}"
    if kind == "union_tag_invalid":
        return "is not one of the choices offered"
    if kind == "value_error":
        return str(context.get("error", "is not valid")).removeprefix("Value error, ")
    return "is not in the expected form"


def errors_of(error: ValidationError) -> list[ErrorDetails]:
    return error.errors(include_url=False, include_input=False, include_context=True)


def auth_errors(error: ValidationError) -> dict[str, str]:
    """An auth spec's problems, each next to its form field (the first one per field)."""
    errors: dict[str, str] = {}
    for details in errors_of(error):
        location = [str(part) for part in details["loc"]]
        method, name = [*location, "", ""][:2]
        field, label = _AUTH_FIELDS.get((method, name)) or _AUTH_FIELDS.get(name) or _AUTH_METHOD
        errors.setdefault(field, sentence(label, problem_of(details)))
    return errors


def row_errors(error: ValidationError, rows: Sequence[int], labels: dict[str, str]) -> dict[int, str]:
    """A validated list's problems by the row each came from (`rows[i]` is item i's row, from 0), numbered from 1
    as the page shows them: `Row 2: the path may not hold empty segments.`"""
    errors: dict[int, str] = {}
    for details in errors_of(error):
        index, *rest = details["loc"] or (0,)
        row = rows[int(index)] if isinstance(index, int) and int(index) < len(rows) else 0
        label = labels.get(str(rest[0])) if rest else None
        errors.setdefault(row, sentence(label, problem_of(details), where=f"Row {row + 1}"))
    return errors


def line_error(error: ValidationError | ValueError, *, where: str, label: str | None) -> str:
    """A textarea line's problem: `Default headers, line 2: the header name may hold only ….`"""
    if isinstance(error, ValidationError):
        return sentence(label, problem_of(errors_of(error)[0]), where=where)
    return sentence(label, str(error), where=where)


def service_errors(error: InvalidInput) -> dict[str, str]:
    """A service's refusal next to the form field it names: `Must use https (…).`"""
    field = _SERVICE_FIELDS.get(error.field, error.field)
    return {field: f"{error.problem[:1].upper()}{error.problem[1:].rstrip('.')}."}
