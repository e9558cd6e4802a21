"""The JSON admin API at /api/v1 (README, Admin API): schemas in, services, schemas out."""

from credgate.admin_api.routes import metrics_router, open_metrics_router, router

__all__ = ["metrics_router", "open_metrics_router", "router"]
