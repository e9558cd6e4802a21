"""The JSON admin API at /api/v1 (README, Admin API): schemas in, services, schemas out."""

from credgate.admin_api.routes import router

__all__ = ["router"]
