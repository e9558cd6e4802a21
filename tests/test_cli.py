"""The credgate command: JSON output, secrets from stdin only, exit codes scripts can rely on."""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from credgate.cli import main
from credgate.crypto import encode_master_key, new_master_key
from tests.secret_sweep import SWEEP

KEY = "sk-test-cli0123456789abcdefghij"
ROTATED_KEY = "sk-test-rotated-0000000000wxyz"


@pytest.fixture
def credgate(tmp_path: Path) -> Any:
    runner = CliRunner()
    SWEEP.register(KEY)
    SWEEP.register(ROTATED_KEY)
    env = {"CREDGATE_DATA_DIR": str(tmp_path / "data")}

    def run(*args: str, stdin: str | None = None, extra_env: dict[str, str] | None = None) -> Result:
        result = runner.invoke(main, list(args), input=stdin, env=env | (extra_env or {}))
        SWEEP.capture(f"cli {args[:2]}", result.output)
        return result

    return run


def project_id(credgate: Any) -> str:
    result = credgate("projects", "create", "demo")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.output)["project"]["id"])


def test_create_token_prints_one_line(credgate: Any) -> None:
    result = credgate("admin", "create-token", "--name", "ci")
    assert result.exit_code == 0
    assert result.output.count("\n") == 1
    assert result.output.startswith("cga_")


def test_add_integration_reads_the_key_from_stdin_and_never_prints_it(credgate: Any) -> None:
    project = project_id(credgate)
    result = credgate(
        "integrations",
        "add",
        project,
        "openai",
        "--template",
        "openai-chat-completions",
        "--api-key-stdin",
        stdin=KEY + "\n",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["key"]["hint"] == "…ghij"
    assert KEY not in result.output


def test_key_set_and_revoke(credgate: Any) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    rotated = credgate("keys", "set", project, "acme", "--api-key-stdin", stdin=ROTATED_KEY)
    assert json.loads(rotated.output)["key"]["hint"] == "…wxyz"
    revoked = credgate("keys", "revoke", project, "acme")
    assert json.loads(revoked.output)["key"] == {
        "status": "revoked",
        "hint": None,
        "updated_at": json.loads(revoked.output)["key"]["updated_at"],
    }


def test_custom_integration_with_auth_and_endpoints(credgate: Any) -> None:
    project = project_id(credgate)
    added = credgate(
        "integrations",
        "add",
        project,
        "acme",
        "--base-url",
        "https://api.acme.test",
        "--auth",
        '{"method": "header", "name": "x-api-key"}',
        "--api-key-stdin",
        stdin=KEY,
    )
    assert json.loads(added.output)["endpoints"] == []
    result = credgate("integrations", "set-endpoints", project, "acme", "POST v1/messages", "* v1/models/**")
    assert json.loads(result.output)["endpoints"] == [
        {"method": "POST", "path": "v1/messages"},
        {"method": "*", "path": "v1/models/**"},
    ]


def test_update_integration(credgate: Any) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    result = credgate(
        "integrations", "update", project, "acme", "--disable", "--header", "x-team=blue", "--timeout-seconds", "30"
    )
    assert result.exit_code == 0, result.output
    updated = json.loads(result.output)
    assert (updated["enabled"], updated["headers"], updated["timeout_seconds"]) == (False, {"x-team": "blue"}, 30.0)


def test_a_custom_integration_names_its_verification_call_from_the_cli(credgate: Any) -> None:
    project = project_id(credgate)
    add = ("integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin")
    refused = credgate(*add, "--verify-call", "DELETE v1/me", stdin=KEY)
    assert refused.exit_code == 2
    assert "--verify-call: method: Input should be 'GET' or 'POST'" in refused.output
    added = credgate(*add, "--verify-call", "get /v1/me", stdin=KEY)
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["verify_call"] == {"method": "GET", "path": "v1/me"}
    changed = credgate("integrations", "update", project, "acme", "--verify-call", "POST auth/check")
    assert json.loads(changed.output)["verify_call"] == {"method": "POST", "path": "auth/check"}
    both = credgate("integrations", "update", project, "acme", "--verify-call", "GET me", "--no-verify-call")
    assert both.exit_code == 2
    assert "exclude each other" in both.output
    kept = credgate("integrations", "update", project, "acme", "--timeout-seconds", "30")
    assert json.loads(kept.output)["verify_call"] == {"method": "POST", "path": "auth/check"}
    removed = credgate("integrations", "update", project, "acme", "--no-verify-call")
    assert removed.exit_code == 0, removed.output
    assert json.loads(removed.output)["verify_call"] is None


def test_rotate_token_with_grace(credgate: Any) -> None:
    project = project_id(credgate)
    result = credgate("projects", "rotate-token", project, "--grace-seconds", "60", "--expires-in-seconds", "3600")
    rotated = json.loads(result.output)
    assert rotated["secret"].startswith("cgp_")
    assert rotated["project"]["token"]["expires_at"] is not None


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("projects", "show", "prj_missing"), 3),
        (("integrations", "set-endpoints", "prj_x", "acme", "GET a/../b"), 2),
        (("integrations", "add", "prj_x", "Bad Name", "--base-url", "https://a.test", "--api-key-stdin"), 2),
        (("keys", "revoke", "prj_missing", "acme"), 3),
    ],
)
def test_errors_have_distinct_exit_codes(credgate: Any, args: tuple[str, ...], code: int) -> None:
    result = credgate(*args, stdin=KEY)
    assert result.exit_code == code, result.output
    assert result.output.startswith("error: ")


def test_conflict_exits_4(credgate: Any) -> None:
    project = project_id(credgate)
    add = ("integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin")
    credgate(*add, stdin=KEY)
    assert credgate(*add, stdin=KEY).exit_code == 4


def test_wrong_master_key_exits_5_and_says_why(credgate: Any) -> None:
    project_id(credgate)
    result = credgate("projects", "list", extra_env={"CREDGATE_MASTER_KEY": encode_master_key(new_master_key())})
    assert result.exit_code == 5
    assert "master key does not match" in result.output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CREDGATE_ADMIN_HOST": "127.0.0.1"}, "CREDGATE_ADMIN_HOST is set without CREDGATE_ADMIN_PORT"),
        ({"CREDGATE_ADMIN_PORT": "0"}, "admin_port: Input should be greater than or equal to 1"),
        ({"CREDGATE_PORT": "18080", "CREDGATE_ADMIN_PORT": "18080"}, "the admin listener needs a port of its own"),
    ],
)
def test_serve_refuses_an_admin_listener_it_cannot_have_and_says_why(
    credgate: Any, env: dict[str, str], message: str
) -> None:
    result = credgate("serve", extra_env=env)
    assert result.exit_code == 5
    assert message in result.output


def test_master_key_rotate_reseals(credgate: Any, tmp_path: Path) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    before = (tmp_path / "data" / "master.key").read_text()
    result = credgate("master-key", "rotate")
    assert result.exit_code == 0, result.output
    assert "1 secrets re-encrypted" in result.output
    assert (tmp_path / "data" / "master.key").read_text() not in ("", before)
    assert credgate("integrations", "show", project, "acme").exit_code == 0


def test_empty_stdin_is_refused(credgate: Any) -> None:
    project = project_id(credgate)
    result = credgate("keys", "set", project, "acme", "--api-key-stdin", stdin="")
    assert result.exit_code == 2
    assert "empty" in result.output


def test_db_upgrade_and_templates(credgate: Any) -> None:
    assert credgate("db", "upgrade").output == "database is up to date\n"
    ids = [template["id"] for template in json.loads(credgate("templates").output)["items"]]
    assert {"openai-chat-completions", "openai-image-generations"} <= set(ids)


def test_create_user_reads_password_from_stdin(credgate: Any) -> None:
    assert credgate("admin", "create-user", "alice", "--password-stdin", stdin="correct horse battery").exit_code == 0
    assert credgate("admin", "create-user", "alice", "--password-stdin", stdin="correct horse battery").exit_code == 4
    assert credgate("admin", "create-user", "bob", "--password-stdin", stdin="short").exit_code == 2


NOT_IN_RANGE = [str(2**64), str(2**70), "-1", "1e400", "nan", "inf", "abc"]


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (("projects", "update", "{project}"), "--rate-limit"),
        (("projects", "rotate-token", "{project}"), "--grace-seconds"),
        (("projects", "rotate-token", "{project}"), "--expires-in-seconds"),
        (("projects", "requests", "{project}"), "--limit"),
        (("projects", "usage", "{project}"), "--days"),
        (("audit",), "--limit"),
        (("integrations", "update", "{project}", "acme"), "--timeout-seconds"),
        (("integrations", "update", "{project}", "acme"), "--stream-idle-timeout"),
    ],
)
def test_a_number_out_of_range_exits_2_naming_the_option(credgate: Any, command: tuple[str, ...], option: str) -> None:
    project = project_id(credgate)
    args = [part.format(project=project) for part in command]
    for value in NOT_IN_RANGE:
        result = credgate(*args, option, value)
        assert result.exit_code == 2, (value, result.output)
        assert option in result.output
        if len(value) > 4:
            assert value not in result.output


def test_the_stream_idle_and_total_timeouts_are_set_and_shown(credgate: Any) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    shown = json.loads(credgate("integrations", "show", project, "acme").output)
    assert (shown["stream_idle_timeout_seconds"], shown["total_timeout_seconds"]) == (300, 3600)
    result = credgate("integrations", "update", project, "acme", "--stream-idle-timeout", "12.5")
    assert result.exit_code == 0, result.output
    result = credgate("integrations", "update", project, "acme", "--total-timeout", "7200")
    assert result.exit_code == 0, result.output
    shown = json.loads(credgate("integrations", "show", project, "acme").output)
    assert (shown["stream_idle_timeout_seconds"], shown["timeout_seconds"], shown["total_timeout_seconds"]) == (
        12.5,
        600,
        7200,
    )
    refused = credgate("integrations", "update", project, "acme", "--total-timeout", "86401")
    assert refused.exit_code == 2
    assert "--total-timeout" in refused.output


def test_a_name_out_of_its_limits_exits_2_and_names_the_field(credgate: Any) -> None:
    result = credgate("projects", "create", "n" * 201)
    assert result.exit_code == 2
    assert result.output == "error: name: must be 1 to 200 characters\n"
    assert credgate("admin", "create-token", "--name", "n" * 201).exit_code == 2


def test_a_key_pool_is_managed_from_the_cli_and_no_secret_is_printed(credgate: Any) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    added = credgate("keys", "add", project, "acme", "--api-key-stdin", "--label", "backup", stdin=ROTATED_KEY)
    assert added.exit_code == 0, added.output
    key = json.loads(added.output)
    assert (key["label"], key["position"], key["status"], key["hint"]) == ("backup", 1, "active", "…wxyz")
    listed = credgate("keys", "list", project, "acme")
    first = json.loads(listed.output)["items"][0]
    assert [found["id"] for found in json.loads(listed.output)["items"]] == [first["id"], key["id"]]

    moved = credgate("keys", "update", project, "acme", key["id"], "--position", "0", "--disable")
    assert moved.exit_code == 0, moved.output
    pool = json.loads(moved.output)["keys"]
    assert [(found["id"], found["status"]) for found in pool] == [(key["id"], "disabled"), (first["id"], "active")]
    removed = credgate("keys", "remove", project, "acme", key["id"])
    assert [found["id"] for found in json.loads(removed.output)["keys"]] == [first["id"]]
    assert credgate("keys", "remove", project, "acme", key["id"]).exit_code == 3
    for result in (added, listed, moved, removed):
        assert KEY not in result.output
        assert ROTATED_KEY not in result.output


def test_budgets_and_a_price_list_are_managed_from_the_cli(credgate: Any) -> None:
    project = project_id(credgate)
    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    priced = credgate("integrations", "set-prices", project, "acme", "gpt-4o-mini*=0.15,0.6", "*=2.5,10")
    assert priced.exit_code == 0, priced.output
    assert json.loads(priced.output)["prices"] == [
        {"model": "gpt-4o-mini*", "input": 0.15, "output": 0.6},
        {"model": "*", "input": 2.5, "output": 10.0},
    ]
    assert credgate("integrations", "set-prices", project, "acme", "gpt-4o").exit_code == 2

    added = credgate("budgets", "add", project, "--metric", "cost", "--limit", "25", "--period", "month")
    assert added.exit_code == 0, added.output
    budget = json.loads(added.output)
    assert (budget["metric"], budget["limit"], budget["spent"], budget["provider"]) == ("cost", 25.0, 0, None)
    assert budget["resets_at"] > budget["period_start"]
    counted = credgate(
        "budgets", "add", project, "--metric", "requests", "--limit", "1000", "--period", "day", "--provider", "acme"
    )
    assert json.loads(counted.output)["limit"] == 1000
    held = credgate(
        "budgets", "add", project, "--metric", "tokens", "--limit", "1e6", "--period", "day", "--reserve", "4000"
    )
    assert (json.loads(held.output)["limit"], json.loads(held.output)["reserve"]) == (1_000_000, 4000)
    refused = credgate("budgets", "add", project, "--metric", "requests", "--limit", "2.5", "--period", "day")
    assert (refused.exit_code, "limit: must be a whole number of requests" in refused.output) == (2, True)
    assert credgate("budgets", "add", project, "--metric", "tokens", "--limit", "9", "--period", "year").exit_code == 2

    updated = credgate("budgets", "update", project, budget["id"], "--limit", "30.5", "--period", "day")
    assert (json.loads(updated.output)["limit"], json.loads(updated.output)["period"]) == (30.5, "day")
    listed = json.loads(credgate("budgets", "list", project).output)["items"]
    assert [found["metric"] for found in listed] == ["cost", "requests", "tokens"]
    assert credgate("budgets", "remove", project, budget["id"]).exit_code == 0
    assert credgate("budgets", "remove", project, budget["id"]).exit_code == 3
    assert credgate("budgets", "update", project, "bud_missing", "--limit", "3").exit_code == 3


def test_webhooks_key_promotion_and_the_key_age_policy_are_managed_from_the_cli(credgate: Any) -> None:
    project = project_id(credgate)
    added = credgate("webhooks", "add", project, "https://hooks.example.test/x", "--event", "budget.threshold")
    assert added.exit_code == 0, added.output
    secret = json.loads(added.output)["secret"]
    # Shown once by design (not a stored secret for the sweep); `list` must not show it.
    webhook = json.loads(added.output)["webhook"]
    assert webhook["events"] == ["budget.threshold"]
    listed = credgate("webhooks", "list", project)
    assert secret not in listed.output
    updated = credgate("webhooks", "update", project, webhook["id"], "--all-events", "--disable")
    assert (json.loads(updated.output)["events"], json.loads(updated.output)["enabled"]) == ([], False)
    tested = credgate("webhooks", "test", project, webhook["id"])
    assert json.loads(tested.output)["type"] == "webhook.test"
    [delivery] = json.loads(credgate("webhooks", "deliveries", project).output)["items"]
    assert (delivery["event_type"], delivery["status"]) == ("webhook.test", "pending")
    assert credgate("webhooks", "add", project, "https://x.test/", "--event", "nope").exit_code == 2
    assert credgate("webhooks", "remove", project, webhook["id"]).exit_code == 0
    assert credgate("webhooks", "remove", project, webhook["id"]).exit_code == 3

    credgate(
        "integrations", "add", project, "acme", "--base-url", "https://api.acme.test", "--api-key-stdin", stdin=KEY
    )
    second = json.loads(credgate("keys", "add", project, "acme", "--api-key-stdin", stdin=ROTATED_KEY).output)
    promoted = credgate("keys", "promote", project, "acme", second["id"], "--retire-previous-after", "600")
    assert promoted.exit_code == 0, promoted.output
    keys = json.loads(promoted.output)["keys"]
    assert keys[0]["id"] == second["id"]
    assert keys[1]["retire_at"] is not None
    policy = credgate("projects", "update", project, "--key-max-age-days", "90")
    assert json.loads(policy.output)["key_max_age_days"] == 90
    cleared = credgate("projects", "update", project, "--no-key-max-age")
    assert json.loads(cleared.output)["key_max_age_days"] is None
    assert credgate("projects", "update", project, "--key-max-age-days", "9", "--no-key-max-age").exit_code == 2
    for result in (added, listed, promoted):
        assert KEY not in result.output
        assert ROTATED_KEY not in result.output


def test_browser_and_end_user_settings(credgate: Any) -> None:
    project = project_id(credgate)
    result = credgate(
        "projects",
        "update",
        project,
        "--allowed-origin",
        "https://App.example",
        "--allowed-origin",
        "http://localhost:5173",
        "--subject-rate-limit",
        "20",
        "--max-concurrent",
        "40",
        "--identity-jwks-url",
        "https://auth.example/jwks.json",
        "--identity-issuer",
        "https://auth.example/",
        "--identity-audience",
        "app",
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["allowed_origins"] == ["https://app.example", "http://localhost:5173"]
    assert shown["subject_rate_limit_per_minute"] == 20
    assert shown["max_concurrent_requests"] == 40
    assert shown["identity_provider"]["audience"] == "app"

    partial = credgate("projects", "update", project, "--identity-issuer", "https://auth.example/")
    assert partial.exit_code == 2
    assert "go together" in partial.output
    bad = credgate("projects", "update", project, "--allowed-origin", "https://app.example/path")
    assert bad.exit_code == 2
    assert "allowed_origins.0" in bad.output

    cleared = credgate(
        "projects",
        "update",
        project,
        "--no-allowed-origins",
        "--no-subject-rate-limit",
        "--no-identity-provider",
        "--no-max-concurrent",
    )
    assert cleared.exit_code == 0, cleared.output
    shown = json.loads(cleared.output)
    assert shown["allowed_origins"] == []
    assert shown["subject_rate_limit_per_minute"] is None
    assert shown["max_concurrent_requests"] is None
    assert shown["identity_provider"] is None
    per_user = credgate(
        "budgets", "add", project, "--metric", "requests", "--limit", "5", "--period", "day", "--per-subject"
    )
    assert per_user.exit_code == 0, per_user.output
    assert json.loads(per_user.output)["per_subject"] is True


def test_admin_roles_are_granted_by_the_cli_and_checked(credgate: Any) -> None:
    project = project_id(credgate)
    token = credgate("admin", "create-token", "--role", "project_admin", "--project", project)
    assert token.exit_code == 0, token.output
    assert token.output.startswith("cga_")
    refused = credgate("admin", "create-token", "--role", "project_admin")
    assert refused.exit_code == 2
    assert "at least one project" in refused.output
    unknown = credgate("admin", "create-token", "--role", "viewer", "--project", "prj_missing")
    assert unknown.exit_code == 2
    created = credgate("admin", "create-user", "ann", "--password-stdin", "--role", "viewer", stdin="a long password\n")
    assert created.exit_code == 0, created.output
    changed = credgate("admin", "set-role", "ann", "--role", "project_admin", "--project", project)
    assert (changed.exit_code, changed.output) == (0, "user ann is now project_admin\n")
    assert credgate("admin", "set-role", "bob", "--role", "viewer").exit_code == 3
    actions = [entry["action"] for entry in json.loads(credgate("audit").output)["items"]]
    assert actions[0] == "admin_user.set_role"
    ended = credgate("admin", "end-sessions", "ann")
    assert (ended.exit_code, ended.output) == (0, "ended 0 sessions of user ann\n")
    assert credgate("admin", "end-sessions", "bob").exit_code == 3


def test_each_command_is_found_in_the_module_that_defines_it() -> None:
    """`main` imports a command's module when it is asked for: a module's every command must be listed, or it
    would never be found."""
    import importlib
    import pkgutil

    import credgate.cli
    from credgate.cli.base import CommandsByModule

    for module in pkgutil.iter_modules(credgate.cli.__path__):
        importlib.import_module(f"credgate.cli.{module.name}")
    defined = {name: command.callback.__module__ for name, command in main.commands.items() if command.callback}
    assert defined == {name: f"credgate.cli.{module}" for name, module in CommandsByModule.modules.items()}


def test_serve_loads_no_other_command() -> None:
    """The process that serves carries only `serve`'s module, not the other commands nor the admin API's schemas
    they print (a few MB of every gateway's memory)."""
    import subprocess
    import sys

    probe = (
        "import sys, click; from credgate.cli import main; main.get_command(click.Context(main), 'serve'); "
        "print(sorted(name for name in sys.modules if name.startswith(('credgate.cli.', 'credgate.admin_api'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['credgate.cli.base', 'credgate.cli.serving']"


_OPEN_AS_SERVE_DOES = """
import asyncio, os, sys
from credgate.cli import serving
from credgate.config import Settings
from credgate.errors import StartupError

async def open_once(data_dir: str) -> None:
    try:
        ctx = await serving._open_context_lean(Settings(data_dir=data_dir))
    except StartupError as error:
        print("refused:", error)
        return
    try:
        left = open(f"/proc/self/task/{os.getpid()}/children").read().split()
        current = await ctx.database.is_current()
        print("current:", current, "alembic loaded:", "alembic" in sys.modules, "processes left:", len(left))
    finally:
        await ctx.close()

if __name__ == "__main__":
    if len(sys.argv) > 2:  # a set-up process that dies
        serving._SET_UP_COMMAND = ("-c", "import sys; sys.exit(" + sys.argv[2] + ")")
    asyncio.run(open_once(sys.argv[1]))
"""


def test_serve_migrates_in_a_process_of_its_own(tmp_path: Path) -> None:
    """A first start (or an upgrade) creates and migrates the database in a process of its own, so the serving
    process never loads alembic and what a migration builds (about 15 MB it would keep for its life), and nothing
    of it is left running beside the gateway; a refusal found there is the start's own, with its message, and a
    set-up process that dies fails the start."""
    import subprocess
    import sys

    def serve_opens(data_dir: Path, *dying: str) -> str:
        command = [sys.executable, "-c", _OPEN_AS_SERVE_DOES, str(data_dir), *dying]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout.strip()

    opened = "current: True alembic loaded: False processes left: 0"
    assert serve_opens(tmp_path / "data") == opened
    assert serve_opens(tmp_path / "data") == opened
    (tmp_path / "data" / "credgate.db").unlink()
    refusal = serve_opens(tmp_path / "data")
    assert refusal.startswith("refused: the database is missing"), refusal
    died = serve_opens(tmp_path / "other", "3")
    assert died == "refused: the database's set-up failed in a process of its own (exit status 3); see above"
