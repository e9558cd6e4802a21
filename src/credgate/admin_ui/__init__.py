"""The admin panel at /admin: server-rendered pages on the services (never the admin API over HTTP)."""

from credgate.admin_ui.app import create_panel

__all__ = ["create_panel"]
