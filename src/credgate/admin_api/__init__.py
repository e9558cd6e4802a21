"""The JSON admin API at /api/v1 (contract section 5): schemas in, services, schemas out."""

from credgate.admin_api.routes import router

__all__ = ["router"]
