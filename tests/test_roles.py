"""credgate.roles: the policy table, decided without I/O."""

import pytest

from credgate.errors import Forbidden, InvalidInput
from credgate.roles import Principal, Role, checked_grant

OWNER = Principal.of(actor="o", role="owner", project_ids=[])
ADMIN_OF_A = Principal.of(actor="p", role="project_admin", project_ids=["a"])
VIEWER = Principal.of(actor="v", role="viewer", project_ids=[])
VIEWER_OF_A = Principal.of(actor="w", role="viewer", project_ids=["a"])


@pytest.mark.parametrize(
    ("principal", "read_a", "read_b", "read_all", "change_a", "change_b", "administer"),
    [
        (OWNER, True, True, True, True, True, True),
        (ADMIN_OF_A, True, False, False, True, False, False),
        (VIEWER, True, True, True, False, False, False),
        (VIEWER_OF_A, True, False, False, False, False, False),
    ],
)
def test_the_policy_table(
    principal: Principal,
    read_a: bool,
    read_b: bool,
    read_all: bool,
    change_a: bool,
    change_b: bool,
    administer: bool,
) -> None:
    assert principal.may_read("a") is read_a
    assert principal.may_read("b") is read_b
    assert principal.may_read(None) is read_all
    assert principal.may_change("a") is change_a
    assert principal.may_change("b") is change_b
    assert principal.may_administer() is administer


def test_a_refusal_names_the_role_and_what_was_refused() -> None:
    with pytest.raises(Forbidden, match=r"this admin token's role \(viewer\) does not allow changing project a"):
        VIEWER.require_change("a")


@pytest.mark.parametrize(
    ("role", "projects", "field"),
    [("root", [], "role"), ("owner", ["a"], "project_ids"), ("project_admin", [], "project_ids")],
)
def test_a_grant_that_makes_no_sense_is_refused(role: str, projects: list[str], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        checked_grant(role, projects)
    assert refused.value.field == field


def test_a_grant_is_stored_sorted_without_repeats() -> None:
    assert checked_grant("viewer", ["b", "a", "b"]) == (Role.VIEWER, ["a", "b"])
