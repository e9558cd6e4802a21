"""The JSON admin API at /api/v1 (README, Admin API): schemas in, services, schemas out.

The routes (FastAPI) are in `routes`, imported by the control app when it is built; the schemas serve the CLI too.
"""
