"""The data plane: `/proxy/<provider>/<endpoint>`. `plan` decides (pure), `relay` does the I/O."""

from credgate.proxy.relay import ProxyApp, create_http_session

__all__ = ["ProxyApp", "create_http_session"]
