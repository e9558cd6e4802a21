"""An integration as the proxy uses it: plain data, settled from storage by the services and read by the
proxy's pure planning, which therefore loads neither the database layer nor the HTTP client."""

from dataclasses import dataclass, field

from credgate.crypto import Secret
from credgate.netguard import NO_PRIVATE_NETWORKS, PrivateNetworks
from credgate.paths import AllowList
from credgate.specs import AuthSpec, Endpoint
from credgate.spending import Price


@dataclass(frozen=True, slots=True)
class IdentityProvider:
    """What a project trusts for its end users: where its signing keys are published, who issues, for which
    audience (identity.py verifies tokens against it)."""

    jwks_url: str
    issuer: str
    audience: str


@dataclass(frozen=True, slots=True)
class PoolKey:
    """A key of an integration's pool that is in service: its id (for its state) and its opened secret."""

    id: str
    secret: Secret


@dataclass(frozen=True, slots=True)
class ResolvedIntegration:
    """An integration as the proxy uses it, with its credential opened (None once revoked)."""

    provider: str
    base_url: str
    auth: AuthSpec
    endpoints: tuple[Endpoint, ...]
    headers: dict[str, str]
    query: dict[str, str]
    enabled: bool
    timeout_seconds: float
    stream_idle_timeout_seconds: float  # a started response that sends nothing this long is cut off
    total_timeout_seconds: float  # a request still under way this long after it arrived is ended (504 or cut off)
    credential: Secret | None  # the first key in service: what a pool of one, and key verification, use
    # The admin's exceptions to the SSRF guard for this integration alone (README, Security).
    private_networks: PrivateNetworks = NO_PRIVATE_NETWORKS
    keys: tuple[PoolKey, ...] = ()  # every key in service, in order (`credential` is the first's secret)
    key_strategy: str = "failover"  # or "spread": requests take the keys in turns
    prices: tuple[Price, ...] = ()  # the admin's price list, first match first
    allow_list: AllowList = field(init=False, repr=False, compare=False)  # `endpoints`, compiled

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_list", AllowList(self.endpoints))
