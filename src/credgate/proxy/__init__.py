"""The data plane: `/proxy/<provider>/<endpoint>`. `plan` decides (pure), `relay` orchestrates the I/O: the
client's side in `client`, the upstream's in `upstreams` (connection pools and the address guard) over
`http_client`, `oauth` and `sigv4`."""

from credgate.proxy.relay import ProxyApp

__all__ = ["ProxyApp"]
