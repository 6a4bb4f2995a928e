"""Server-rendered dashboard pages and live SSE, mounted by the gateway."""
