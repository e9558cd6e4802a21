"""`credgate audit export` and `credgate audit verify`: an export verifies; an edited, deleted or reordered line is
named, with exit 2; entries cut from the end are found only by comparing heads; `--database` checks the stored
chain (exit 5 when broken)."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from credgate.cli import main


@pytest.fixture
def credgate(tmp_path: Path) -> Any:
    runner = CliRunner()
    env = {"CREDGATE_DATA_DIR": str(tmp_path / "data")}

    def run(*args: str, stdin: str | None = None) -> Result:
        return runner.invoke(main, list(args), input=stdin, env=env)

    for name in ("a", "b", "c", "d"):
        assert run("projects", "create", name).exit_code == 0
    return run


def verdict(result: Result) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def export(credgate: Any) -> list[str]:
    result = credgate("audit", "export")
    assert result.exit_code == 0, result.output
    return list(result.stdout.splitlines(keepends=True))


def test_an_export_verifies_to_the_stored_head(credgate: Any) -> None:
    lines = export(credgate)
    assert len(lines) == 4
    checked = credgate("audit", "verify", "-", stdin="".join(lines))
    assert checked.exit_code == 0
    assert verdict(checked) == {"verified": True, "entries": 4, "head": json.loads(lines[-1])["hash"]}
    stored = credgate("audit", "verify", "--database")
    assert stored.exit_code == 0
    assert verdict(stored) == verdict(checked)


def test_export_to_a_file_prints_its_head(credgate: Any, tmp_path: Path) -> None:
    target = tmp_path / "audit.jsonl"
    result = credgate("audit", "export", "--output", str(target))
    assert result.exit_code == 0, result.output
    checked = credgate("audit", "verify", str(target))
    assert verdict(result) == {"entries": 4, "head": verdict(checked)["head"]}
    assert target.stat().st_mode & 0o777 == 0o600
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".partial")] == []


def refused_at(credgate: Any, lines: list[str]) -> dict[str, Any]:
    result = credgate("audit", "verify", "-", stdin="".join(lines))
    assert result.exit_code == 2
    found = verdict(result)
    assert found["verified"] is False
    assert f"line {found['line']}: {found['problem']}" in result.stderr
    return found


def test_an_edited_field_is_named_by_its_line(credgate: Any) -> None:
    lines = export(credgate)
    entry = json.loads(lines[1])
    entry["actor"] = "someone else"
    lines[1] = json.dumps(entry) + "\n"
    assert refused_at(credgate, lines) == {
        "verified": False,
        "line": 2,
        "problem": "hash mismatch: the entry was edited",
    }


def test_a_deleted_line_is_named_by_the_line_after_it(credgate: Any) -> None:
    lines = export(credgate)
    del lines[1]
    found = refused_at(credgate, lines)
    assert found["line"] == 2
    assert found["problem"].startswith("previous_hash mismatch")


def test_reordered_lines_are_refused(credgate: Any) -> None:
    lines = export(credgate)
    lines[1], lines[2] = lines[2], lines[1]
    assert refused_at(credgate, lines)["line"] == 2


def test_a_malformed_line_is_named(credgate: Any) -> None:
    lines = export(credgate)
    lines[2] = "{not json\n"
    assert refused_at(credgate, lines) == {"verified": False, "line": 3, "problem": "malformed line: not JSON"}


def test_lines_cut_from_the_end_verify_but_to_another_head(credgate: Any) -> None:
    """The chain alone cannot tell (README): only the head compared with the stored one can."""
    cut = credgate("audit", "verify", "-", stdin="".join(export(credgate)[:2]))
    assert cut.exit_code == 0
    assert verdict(cut)["entries"] == 2
    assert verdict(cut)["head"] != verdict(credgate("audit", "verify", "--database"))["head"]


def test_a_stored_chain_edited_in_the_database_exits_5_naming_the_entry(credgate: Any, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "data" / "credgate.db") as db:
        db.execute("UPDATE audit_events SET action = 'project.delete' WHERE id = 3")
    db.close()
    result = credgate("audit", "verify", "--database")
    assert result.exit_code == 5
    assert verdict(result) == {
        "verified": False,
        "entries": 2,
        "id": 3,
        "problem": "hash mismatch: the entry was edited",
    }
    assert "entry id 3" in result.stderr


def test_verify_takes_a_file_or_the_database_not_both(credgate: Any, tmp_path: Path) -> None:
    assert credgate("audit", "verify").exit_code == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert credgate("audit", "verify", str(tmp_path / "empty.jsonl"), "--database").exit_code == 2
    assert credgate("audit", "verify", str(tmp_path / "missing.jsonl")).exit_code == 2


def test_the_audit_list_still_answers_without_a_subcommand(credgate: Any) -> None:
    result = credgate("audit", "--limit", "2")
    assert result.exit_code == 0
    assert [event["action"] for event in json.loads(result.output)["items"]] == ["project.create"] * 2
