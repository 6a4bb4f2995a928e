"""The web dashboard, served by the gateway under ``/dashboard``: server-rendered Jinja2 pages with
inline SVG charts, a live feed over Server-Sent Events, and the adapter admin actions behind an
admin sign-in with CSRF tokens. No CDN and no third-party front-end code: the little script it has
is its own, under ``static/``."""
