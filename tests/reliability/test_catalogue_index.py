"""docs/reliability.md and the suite in step: every check of the catalogue is listed once, in order, and each
place it names holds it (a test named after its id, or the id in the bench script)."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
GROUPS = {"BI": 12, "AU": 16, "SE": 13, "SS": 10, "FT": 18, "LS": 10}
ROW = re.compile(r"^\| ([A-Z]{2}-\d{2}) \| [^|]+ \| ([^|]+) \|([^|]*)\|$")


def rows() -> list[tuple[str, list[str]]]:
    lines = (ROOT / "docs" / "reliability.md").read_text().splitlines()
    matches = [ROW.match(line) for line in lines if line.startswith("| ") and line[2:4] in GROUPS]
    assert all(matches), "a row of the table is malformed"
    return [(match[1], [place.strip() for place in match[2].split(",")]) for match in matches if match]


def test_every_check_is_listed_once_in_catalogue_order() -> None:
    expected = [f"{group}-{number:02d}" for group, count in GROUPS.items() for number in range(1, count + 1)]
    assert [check for check, _ in rows()] == expected


def test_every_place_named_holds_its_check() -> None:
    for check, places in rows():
        name = "test_" + check.replace("-", "").lower()
        for place in places:
            text = (ROOT / place).read_text()
            if place.startswith("tests/reliability/"):
                assert f"def {name}_" in text, f"{check}: no {name}_… in {place}"
            elif place.startswith("bench/"):
                assert check in text, f"{check}: not named in {place}"


def test_every_catalogue_test_is_in_the_table() -> None:
    listed = {(check, place) for check, places in rows() for place in places}
    for module in (ROOT / "tests" / "reliability").glob("test_*.py"):
        for prefix in set(re.findall(r"def test_([a-z]{2})(\d{2})_", module.read_text())):
            check = f"{prefix[0].upper()}-{prefix[1]}"
            assert (check, f"tests/reliability/{module.name}") in listed, f"{check} in {module.name} is not listed"
