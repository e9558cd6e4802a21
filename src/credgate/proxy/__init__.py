"""The data plane: `/proxy/<provider>/<endpoint>`. `plan` decides (pure), `relay` orchestrates the I/O: the
client's side in `client`, the upstream's in `upstreams` (sessions and the address guard), `oauth` and `sigv4`."""

from credgate.proxy.relay import ProxyApp
from credgate.proxy.upstreams import create_http_session

__all__ = ["ProxyApp", "create_http_session"]
