"""The FastAPI gateway: OpenAI-compatible agent API, hop routing, registry, admin and metrics."""
