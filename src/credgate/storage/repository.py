"""Repository: the queries of the domain, on one session inside one transaction."""

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import Table, case, delete, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased, joinedload, raiseload, selectinload

from credgate.audit_chain import GENESIS, chain_entry
from credgate.limits import MAX_ACTOR_LENGTH, MAX_LISTED
from credgate.storage.models import (
    AdminSession,
    AdminToken,
    AdminUser,
    AuditEvent,
    Base,
    Budget,
    Event,
    EventDelivery,
    Integration,
    Meta,
    Project,
    ProjectToken,
    ProviderKey,
    RequestRecord,
    Webhook,
)

_REQUEST_RECORDS = cast(Table, RequestRecord.__table__)
_RECORD_COLUMNS = [column for column in _REQUEST_RECORDS.columns if column.name != "id"]
# SQLite: INSERT … SELECT from a VALUES list of _SQLITE_RECORDS_A_STATEMENT rows, the last one of a batch padded with
# rows of NULLs that the WHERE leaves out; one shape, so that each connection prepares one statement (0.2 MB; one of
# 512 rows takes 1.7 MB). 60 rows are 960 values, within the 999 an SQLite older than 3.32 binds at most.
_SQLITE_RECORDS_A_STATEMENT = 60
_SQLITE_NAMES = ", ".join(column.name for column in _RECORD_COLUMNS)
_SQLITE_VALUES = ", ".join([f"({', '.join('?' * len(_RECORD_COLUMNS))})"] * _SQLITE_RECORDS_A_STATEMENT)
_SQLITE_RECORDS_INSERT = (  # our own names: nothing from outside is in the text
    f"INSERT INTO request_records ({_SQLITE_NAMES}) SELECT * FROM (VALUES {_SQLITE_VALUES}) "  # noqa: S608
    "WHERE column1 IS NOT NULL"
)

# The advisory lock (a number of our own, PostgreSQL-wide) that queues claims of identity providers.
_IDENTITY_CLAIMS_LOCK = 0x6367_6964  # "cgid"
# The meta row holding the hash of the audit log's newest entry: locked by every append, so appends queue.
AUDIT_HEAD = "audit_head"


class RequestRow(NamedTuple):
    """A request log row as written: the table's columns, in its order (a tuple: one per proxied request)."""

    at: datetime
    project_id: str
    request_id: str
    method: str
    provider: str
    endpoint: str
    status: int
    duration_ms: float
    request_bytes: int
    response_bytes: int
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None
    cost_micros: int | None
    admitted: bool
    subject: str | None


@dataclass(frozen=True, slots=True)
class UsageRow:
    group: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ResolvedRow:
    """What the proxy lookup found for a token hash and a provider name."""

    token: ProjectToken | None
    integration: Integration | None
    project: Project | None = None  # with its budgets


class Repository:
    """Typed queries over one session; the services never build SQL themselves."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    def add(self, row: Base) -> None:
        self._session.add(row)

    async def flush(self) -> None:
        """Send pending changes without committing (the transaction still decides)."""
        await self._session.flush()

    async def delete(self, row: Base) -> None:
        await self._session.delete(row)

    async def refresh(self, row: Base, attributes: Sequence[str] | None = None) -> None:
        await self._session.refresh(row, attributes)

    # meta

    async def get_meta(self, name: str) -> str | None:
        row = await self._session.get(Meta, name)
        return row.value if row else None

    async def set_meta(self, name: str, value: str) -> None:
        await self._session.merge(Meta(name=name, value=value))

    async def notify(self, channel: str, payload: str) -> None:
        """On PostgreSQL, `payload` on `channel` to every listening connection, sent when (and only if) this
        transaction commits; nothing elsewhere."""
        if self._session.get_bind().dialect.name == "postgresql":
            await self._session.execute(select(func.pg_notify(channel, payload)))

    # projects and their tokens

    async def get_project(self, project_id: str) -> Project | None:
        statement = select(Project).where(Project.id == project_id).options(selectinload(Project.tokens))
        return (await self._session.scalars(statement)).one_or_none()

    async def list_projects(self) -> Sequence[Project]:
        statement = select(Project).options(selectinload(Project.tokens)).order_by(Project.created_at, Project.id)
        return (await self._session.scalars(statement)).all()

    async def delete_project_tokens(self, project_id: str, *, expired_before: datetime | None = None) -> None:
        statement = delete(ProjectToken).where(ProjectToken.project_id == project_id)
        if expired_before is not None:
            statement = statement.where(ProjectToken.expires_at <= expired_before)
        await self._session.execute(statement)

    async def cap_project_token_expiry(self, project_id: str, *, expires_at: datetime) -> None:
        await self._session.execute(
            update(ProjectToken)
            .where(ProjectToken.project_id == project_id)
            .where((ProjectToken.expires_at.is_(None)) | (ProjectToken.expires_at > expires_at))
            .values(expires_at=expires_at)
        )

    async def touch_project_tokens(self, token_hashes: Sequence[str], *, at: datetime) -> None:
        await self._session.execute(
            update(ProjectToken).where(ProjectToken.token_hash.in_(token_hashes)).values(last_used_at=at)
        )

    async def resolve(self, *, token_hash: str, provider: str) -> ResolvedRow:
        """The token and the integration it may use, in one indexed query (the proxy's lookup)."""
        statement = (
            select(ProjectToken, Integration, Project)
            .join(Project, Project.id == ProjectToken.project_id)
            .outerjoin(
                Integration,
                (Integration.project_id == ProjectToken.project_id) & (Integration.provider == provider),
            )
            .where(ProjectToken.token_hash == token_hash)
            # The pool and the project's budgets in the same query: one query per lookup.
            .options(joinedload(Integration.keys), joinedload(Project.budgets))
        )
        row = (await self._session.execute(statement)).unique().one_or_none()
        if row is None:
            return ResolvedRow(token=None, integration=None)
        return ResolvedRow(token=row[0], integration=row[1], project=row[2])

    async def resolve_project(self, *, project_id: str, provider: str) -> tuple[Project, Integration | None] | None:
        """A project and its integration for `provider`, in one query (the proxy's lookup for identity tokens)."""
        statement = (
            select(Project, Integration)
            .outerjoin(Integration, (Integration.project_id == Project.id) & (Integration.provider == provider))
            .where(Project.id == project_id)
            .options(joinedload(Integration.keys), joinedload(Project.budgets))
        )
        row = (await self._session.execute(statement)).unique().one_or_none()
        return None if row is None else (row[0], row[1])

    async def project_directory(self) -> Sequence[tuple[str, list[Any], dict[str, Any] | None]]:
        """Every project's id, allowed origins and identity provider: what a request without a token needs."""
        statement = select(Project.id, Project.allowed_origins, Project.identity_provider)
        return [(row[0], row[1], row[2]) for row in await self._session.execute(statement)]

    # admin tokens and users

    async def find_admin_token(self, token_hash: str) -> AdminToken | None:
        return (await self._session.scalars(select(AdminToken).where(AdminToken.token_hash == token_hash))).first()

    async def find_admin_user(self, username: str) -> AdminUser | None:
        return (await self._session.scalars(select(AdminUser).where(AdminUser.username == username))).first()

    async def find_oidc_user(self, oidc_subject: str) -> AdminUser | None:
        return (await self._session.scalars(select(AdminUser).where(AdminUser.oidc_subject == oidc_subject))).first()

    async def count_admin_users(self) -> int:
        return int((await self._session.execute(select(func.count()).select_from(AdminUser))).scalar_one())

    async def list_admin_users(self) -> Sequence[AdminUser]:
        return (await self._session.scalars(select(AdminUser).order_by(AdminUser.username))).all()

    async def get_admin_user(self, user_id: str) -> AdminUser | None:
        return await self._session.get(AdminUser, user_id)

    async def list_admin_tokens(self) -> Sequence[AdminToken]:
        statement = select(AdminToken).order_by(AdminToken.created_at, AdminToken.id)
        return (await self._session.scalars(statement)).all()

    async def get_admin_token(self, token_id: str) -> AdminToken | None:
        return await self._session.get(AdminToken, token_id)

    async def lock_identity_claims(self) -> None:
        """Queue the changes that claim an identity provider's issuer and audience for a project, until the
        transaction ends (a transaction-scoped advisory lock on PostgreSQL; SQLite's write transactions are
        serialised already): the second reads the first's claim before it claims, so no two projects hold one."""
        if self._session.get_bind().dialect.name == "postgresql":
            await self._session.execute(select(func.pg_advisory_xact_lock(_IDENTITY_CLAIMS_LOCK)))

    async def lock_owner_ids(self) -> list[str]:
        """The ids of every owner, users' and tokens', locked until the transaction ends (FOR UPDATE on PostgreSQL,
        in one order; SQLite's write transactions are serialised already): two changes that would each leave one
        owner queue, and the second sees the first's outcome."""
        found: list[str] = []
        for model in (AdminUser, AdminToken):
            statement = select(model.id).where(model.role == "owner").order_by(model.id).with_for_update()
            found += [str(each) for each in (await self._session.scalars(statement)).all()]
        return found

    async def delete_admin_sessions_of(self, user_id: str) -> int:
        """End every session of a user, its panel state with it (as the foreign key's cascade would: said here
        rather than left to it). Returns how many there were."""
        result = await self._session.execute(delete(AdminSession).where(AdminSession.user_id == user_id))
        return int(getattr(result, "rowcount", 0))

    async def get_admin_session(self, session_id: str) -> AdminSession | None:
        return await self._session.get(AdminSession, session_id)

    async def lock_admin_session(self, session_id: str) -> AdminSession | None:
        """The session row, locked until the transaction ends, so that a read-and-clear of its panel state is
        one step (FOR UPDATE on PostgreSQL; SQLite's write transactions are serialised already)."""
        statement = (
            select(AdminSession)
            .where(AdminSession.id == session_id)
            .options(raiseload(AdminSession.user))
            .with_for_update()
        )
        return (await self._session.scalars(statement)).one_or_none()

    async def lock_admin_sessions_with_sealed_state(self) -> Sequence[AdminSession]:
        statement = (
            select(AdminSession)
            .where(AdminSession.flash_secret.is_not(None) | AdminSession.pending_setup.is_not(None))
            .options(raiseload(AdminSession.user))
            .with_for_update()
        )
        return (await self._session.scalars(statement)).all()

    async def delete_admin_sessions(self, *, last_seen_before: datetime, created_before: datetime) -> None:
        """Delete the sessions idle since `last_seen_before` or begun before `created_before`, state included."""
        await self._session.execute(
            delete(AdminSession).where(
                (AdminSession.last_seen_at < last_seen_before) | (AdminSession.created_at < created_before)
            )
        )

    async def delete_meta(self, name: str, *, only_if: str | None = None) -> bool:
        """Delete a named value (only if it equals `only_if`, when given); True when a row was deleted."""
        statement = delete(Meta).where(Meta.name == name)
        if only_if is not None:
            statement = statement.where(Meta.value == only_if)
        result = await self._session.execute(statement)
        return bool(getattr(result, "rowcount", 0))

    # integrations and keys

    async def get_integration(self, project_id: str, provider: str) -> Integration | None:
        statement = select(Integration).where(Integration.project_id == project_id, Integration.provider == provider)
        return (await self._session.scalars(statement)).unique().one_or_none()

    async def list_integrations(self, project_id: str) -> Sequence[Integration]:
        statement = select(Integration).where(Integration.project_id == project_id).order_by(Integration.provider)
        return (await self._session.scalars(statement)).unique().all()

    async def provider_keys_not_under(self, master_key_id: str, *, limit: int) -> Sequence[ProviderKey]:
        statement = (
            select(ProviderKey)
            .options(selectinload(ProviderKey.integration))
            .where(ProviderKey.ciphertext.is_not(None), ProviderKey.master_key_id != master_key_id)
            .limit(limit)
        )
        return (await self._session.scalars(statement)).all()

    async def reseal_provider_key(
        self, key: ProviderKey, *, ciphertext: bytes, master_key_id: str, expected: bytes
    ) -> bool:
        """Replace a ciphertext only if nobody changed it meanwhile; True when it was replaced."""
        result = await self._session.execute(
            update(ProviderKey)
            .where(ProviderKey.id == key.id, ProviderKey.ciphertext == expected)
            .values(ciphertext=ciphertext, master_key_id=master_key_id)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    # request records

    async def insert_request_records(self, rows: Sequence[RequestRow]) -> None:
        """The rows in one statement, executed many: no ORM objects, nor the ORM's bulk path, on the proxy's event loop.

        PostgreSQL: a Core INSERT, executed many. SQLite: the rows' values bound, 60 rows a statement, executed
        many. SQLite's executemany steps once per parameter set, handing the GIL back and forth with the event loop
        each time: a set a row made 5,000 rows take 2.5 s instead of 30 ms under load, and the pending records
        piled up (bench/sustained.py). One JSON document unpacked by `json_each` took one step, but SQLite parsed
        each row's JSON again for each of its 16 columns: 11 µs a row against 6."""
        if not rows:
            return
        dialect = self._session.get_bind().dialect
        if dialect.name != "sqlite":
            await self._session.execute(insert(_REQUEST_RECORDS), [row._asdict() for row in rows])
            return
        # Only the columns whose type converts a value (a moment, a float, a boolean) are gone through one by one.
        converted = [
            (index, bind)
            for index, column in enumerate(_RECORD_COLUMNS)
            if (bind := column.type.dialect_impl(dialect).bind_processor(dialect)) is not None
        ]
        values: list[object] = []
        for row in rows:
            start = len(values)
            values += row
            for index, bind in converted:
                values[start + index] = bind(values[start + index])
        width = len(_RECORD_COLUMNS) * _SQLITE_RECORDS_A_STATEMENT
        values += [None] * (-len(values) % width)
        statements = [tuple(values[start : start + width]) for start in range(0, len(values), width)]
        connection = await self._session.connection()
        await connection.exec_driver_sql(_SQLITE_RECORDS_INSERT, statements)

    async def list_request_records(self, project_id: str, *, limit: int) -> Sequence[RequestRecord]:
        statement = (
            select(RequestRecord)
            .where(RequestRecord.project_id == project_id)
            .order_by(RequestRecord.at.desc(), RequestRecord.id.desc())
            .limit(limit)
        )
        return (await self._session.scalars(statement)).all()

    async def usage_totals(
        self, project_id: str, *, since: datetime, until: datetime, group_by: str | None
    ) -> Sequence[UsageRow]:
        """Requests, errors and tokens of a project in [since, until), grouped by provider, day or end user (or
        not); by end user, the MAX_LISTED busiest ("": requests made without one)."""
        group: Any = {
            None: literal(""),
            "provider": RequestRecord.provider,
            "day": func.date(RequestRecord.at),
            "subject": func.coalesce(RequestRecord.subject, ""),
        }[group_by]
        statement = (
            select(
                group.label("group"),
                func.count(),
                func.sum(case((RequestRecord.status >= 400, 1), else_=0)),
                func.sum(RequestRecord.prompt_tokens),
                func.sum(RequestRecord.completion_tokens),
            )
            .where(RequestRecord.project_id == project_id, RequestRecord.at >= since, RequestRecord.at < until)
            .group_by(group)
            .order_by(func.count().desc(), group)
            .limit(MAX_LISTED)
        )
        if group_by != "subject":
            statement = statement.order_by(None).order_by(group).limit(None)
        return [
            UsageRow(str(row[0]), int(row[1]), int(row[2] or 0), int(row[3] or 0), int(row[4] or 0))
            for row in (await self._session.execute(statement)).all()
        ]

    async def spent(
        self,
        project_id: str,
        *,
        metric: str,
        provider: str | None,
        since: datetime,
        subject: str | None = None,
        busiest_subject: bool = False,
    ) -> int:
        """What the request log says a project spent since `since`: requests (those that passed every check),
        tokens or cost (micro-dollars), of one provider or all, of one end user, all, or (`busiest_subject`) the
        end user who spent the most."""
        measure: Any = {
            "requests": func.count(),
            "tokens": func.sum(
                func.coalesce(RequestRecord.prompt_tokens, 0) + func.coalesce(RequestRecord.completion_tokens, 0)
            ),
            "cost": func.sum(RequestRecord.cost_micros),
        }[metric]
        conditions = [RequestRecord.project_id == project_id, RequestRecord.at >= since]
        if metric == "requests":
            conditions.append(RequestRecord.admitted.is_(True))
        if provider is not None:
            conditions.append(RequestRecord.provider == provider)
        if subject is not None:
            conditions.append(RequestRecord.subject == subject)
        statement = select(measure).where(*conditions)
        if busiest_subject:
            each = (
                select(measure.label("spent"))
                .where(*conditions, RequestRecord.subject.is_not(None))
                .group_by(RequestRecord.subject)
                .subquery()
            )
            statement = select(func.max(each.c.spent))
        return int((await self._session.execute(statement)).scalar_one() or 0)

    async def delete_request_records(self, *, before: datetime) -> None:
        await self._session.execute(delete(RequestRecord).where(RequestRecord.at < before))

    # budgets

    async def list_budgets(self, project_id: str) -> Sequence[Budget]:
        statement = select(Budget).where(Budget.project_id == project_id).order_by(Budget.created_at, Budget.id)
        return (await self._session.scalars(statement)).all()

    async def get_budget(self, project_id: str, budget_id: str) -> Budget | None:
        statement = select(Budget).where(Budget.project_id == project_id, Budget.id == budget_id)
        return (await self._session.scalars(statement)).one_or_none()

    async def list_all_budgets(self) -> Sequence[Budget]:
        return (await self._session.scalars(select(Budget).order_by(Budget.project_id, Budget.id))).all()

    # key age, retirement, token expiry (what the event scan looks for)

    async def keys_under_age_policy(self) -> Sequence[tuple[ProviderKey, Integration, int]]:
        """Every key with a secret, of a project with a key age policy, with its integration and the policy."""
        statement = (
            select(ProviderKey, Integration, Project.key_max_age_days)
            .join(Integration, Integration.id == ProviderKey.integration_id)
            .join(Project, Project.id == Integration.project_id)
            .where(Project.key_max_age_days.is_not(None), ProviderKey.ciphertext.is_not(None))
            .order_by(ProviderKey.id)
            .options(raiseload(Integration.keys))
        )
        return [(row[0], row[1], int(row[2] or 0)) for row in (await self._session.execute(statement)).all()]

    async def keys_to_retire(self, *, now: datetime) -> Sequence[ProviderKey]:
        statement = (
            select(ProviderKey)
            .where(ProviderKey.retire_at.is_not(None), ProviderKey.retire_at <= now)
            .options(selectinload(ProviderKey.integration))
        )
        return (await self._session.scalars(statement)).all()

    async def tokens_expiring(self, *, after: datetime, before: datetime) -> Sequence[ProjectToken]:
        """Projects' current tokens (their newest: older ones are in a rotation's grace) expiring in the window."""
        newer = aliased(ProjectToken)
        statement = (
            select(ProjectToken)
            .where(ProjectToken.expires_at > after, ProjectToken.expires_at <= before)
            .where(
                ~select(newer.id)
                .where(newer.project_id == ProjectToken.project_id, newer.created_at > ProjectToken.created_at)
                .exists()
            )
            .order_by(ProjectToken.id)
        )
        return (await self._session.scalars(statement)).all()

    # events and webhooks

    async def list_webhooks(self, project_id: str) -> Sequence[Webhook]:
        statement = select(Webhook).where(Webhook.project_id == project_id).order_by(Webhook.created_at, Webhook.id)
        return (await self._session.scalars(statement)).all()

    async def get_webhook(self, project_id: str, webhook_id: str) -> Webhook | None:
        statement = select(Webhook).where(Webhook.project_id == project_id, Webhook.id == webhook_id)
        return (await self._session.scalars(statement)).one_or_none()

    async def webhooks_not_under(self, master_key_id: str, *, limit: int) -> Sequence[Webhook]:
        statement = select(Webhook).where(Webhook.master_key_id != master_key_id).limit(limit)
        return (await self._session.scalars(statement)).all()

    async def existing_once_keys(self, once_keys: Sequence[str]) -> set[str]:
        """Which of these events have been written already (asked a thousand at a time: a query's parameters are
        bounded)."""
        found: set[str] = set()
        for start in range(0, len(once_keys), 1000):
            statement = select(Event.once_key).where(Event.once_key.in_(once_keys[start : start + 1000]))
            found |= {str(key) for key in (await self._session.scalars(statement)).all()}
        return found

    async def add_event_once(self, event: Event) -> bool:
        """Insert `event` unless one with its `once_key` exists (whoever else noticed it first); True when
        inserted. A conflict leaves the transaction usable."""
        if event.once_key is not None:
            found = await self._session.scalar(select(Event.id).where(Event.once_key == event.once_key))
            if found is not None:
                return False
            try:
                async with self._session.begin_nested():
                    self._session.add(event)
            except IntegrityError:  # noticed at the same moment elsewhere
                return False
            return True
        self._session.add(event)
        return True

    async def has_due_deliveries(self, *, now: datetime) -> bool:
        statement = (
            select(EventDelivery.id)
            .where(EventDelivery.status == "pending", EventDelivery.next_attempt_at <= now)
            .limit(1)
        )
        return (await self._session.scalar(statement)) is not None

    async def claim_due_deliveries(
        self, *, now: datetime, lease_until: datetime, limit: int
    ) -> Sequence[EventDelivery]:
        """Pending deliveries due by `now`, leased until `lease_until` so that no other process sends them
        meanwhile (rows another transaction holds are skipped on PostgreSQL)."""
        statement = (
            select(EventDelivery)
            .where(EventDelivery.status == "pending", EventDelivery.next_attempt_at <= now)
            .order_by(EventDelivery.next_attempt_at, EventDelivery.id)
            .limit(limit)
            .with_for_update(skip_locked=True, of=EventDelivery)
        )
        due = (await self._session.scalars(statement)).unique().all()
        for delivery in due:
            delivery.next_attempt_at = lease_until
        return due

    async def get_delivery(self, delivery_id: int) -> EventDelivery | None:
        return await self._session.get(EventDelivery, delivery_id)

    async def list_deliveries(
        self, project_id: str, *, limit: int, webhook_id: str | None = None
    ) -> Sequence[EventDelivery]:
        statement = (
            select(EventDelivery)
            .join(Event, Event.id == EventDelivery.event_id)
            .where(Event.project_id == project_id)
            .order_by(EventDelivery.created_at.desc(), EventDelivery.id.desc())
            .limit(limit)
        )
        if webhook_id is not None:
            statement = statement.where(EventDelivery.webhook_id == webhook_id)
        return (await self._session.scalars(statement)).unique().all()

    # audit

    async def append_audit_event(
        self,
        *,
        at: datetime,
        actor: str,
        action: str,
        project_id: str | None = None,
        provider: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> AuditEvent:
        """Append an entry to the audit log's hash chain: the one way an entry is written (README, Audit log).

        The head is locked first (its meta row: FOR UPDATE on PostgreSQL; on SQLite a write transaction holds
        the database's write lock from its BEGIN IMMEDIATE), so the appends of concurrent transactions, of any
        worker or instance, queue, each linked to the one committed before it. The lock is held until the
        transaction ends: call this last, with no I/O after it. The actor is cut to its column's width.
        """
        await self._session.flush()  # the change's own writes (and any wait on their rows) before the lock
        previous = await self._lock_audit_head()
        entry = chain_entry(
            at=at,
            actor=actor[:MAX_ACTOR_LENGTH],
            action=action,
            project_id=project_id,
            provider=provider,
            detail=detail,
            previous_hash=previous,
        )
        row = AuditEvent(
            at=at,
            actor=entry["actor"],
            action=action,
            project_id=project_id,
            provider=provider,
            detail=entry["detail"],
            previous_hash=previous,
            hash=entry["hash"],
        )
        self._session.add(row)
        await self._session.execute(
            update(Meta)
            .where(Meta.name == AUDIT_HEAD)
            .values(value=row.hash)
            .execution_options(synchronize_session=False)
        )
        await self._session.flush()  # the id is drawn under the lock: id order is the chain's order
        return row

    async def _lock_audit_head(self) -> str:
        locked = select(Meta.value).where(Meta.name == AUDIT_HEAD).with_for_update()
        head = await self._session.scalar(locked)
        if head is None:  # a database whose head row went missing: made again from the newest entry
            newest = await self._session.scalar(select(AuditEvent.hash).order_by(AuditEvent.id.desc()).limit(1))
            with suppress(IntegrityError):  # made at the same moment by another transaction, which committed
                async with self._session.begin_nested():
                    self._session.add(Meta(name=AUDIT_HEAD, value=newest or GENESIS))
            head = await self._session.scalar(locked)
        return str(head)

    async def audit_head(self) -> tuple[str | None, int]:
        """The stored head and the newest entry's id, read in one statement, so from one snapshot: they agree
        (the head is the hash of that entry, or GENESIS and 0) unless the database was edited."""
        head = select(Meta.value).where(Meta.name == AUDIT_HEAD).scalar_subquery()
        newest = select(func.max(AuditEvent.id)).scalar_subquery()
        found = (await self._session.execute(select(head, newest))).one()
        return found[0], int(found[1] or 0)

    async def audit_chain_page(self, *, after_id: int, up_to_id: int, limit: int) -> Sequence[AuditEvent]:
        """Entries with `after_id` < id <= `up_to_id`, in id order (the chain's): a page of an export."""
        statement = (
            select(AuditEvent)
            .where(AuditEvent.id > after_id, AuditEvent.id <= up_to_id)
            .order_by(AuditEvent.id)
            .limit(limit)
        )
        return (await self._session.scalars(statement)).all()

    async def list_audit_events(self, *, limit: int, project_id: str | None = None) -> Sequence[AuditEvent]:
        statement = select(AuditEvent).order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(limit)
        if project_id is not None:
            statement = statement.where(AuditEvent.project_id == project_id)
        return (await self._session.scalars(statement)).all()
