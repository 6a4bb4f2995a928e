"""One router per resource: chat, models, admin, health."""
