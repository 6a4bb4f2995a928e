"""The check a load run ends with: ``Verify`` reads a conversation's latest stored turn, given the
client key and the conversation id (None when nothing is stored). ``bench.load`` calls it;
``bench.load_server`` builds one over the gateway's services."""

from __future__ import annotations

from collections.abc import Callable

Verify = Callable[[str, str], str | None]
