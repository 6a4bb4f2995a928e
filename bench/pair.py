"""The command-line preamble the map probes share: a sender, a receiver and an adapter folder.

``pair_parser`` builds the parser with those three positionals; ``load_pair`` loads both engines
from the zoo and the adapter checked against their fingerprints, so a map fitted for another pair
is refused before any probe runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engines.local import LocalEngine
from engines.zoo import Zoo
from heterofold.adapter import Adapter


def pair_parser(doc: str | None, adapter_help: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with sender, receiver and adapter."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("sender")
    ap.add_argument("receiver")
    ap.add_argument("adapter", type=Path, help=adapter_help)
    return ap


def load_pair(args: argparse.Namespace) -> tuple[LocalEngine, LocalEngine, Adapter]:
    """The sender and receiver engines named in ``args`` and the adapter at ``args.adapter``."""
    zoo = Zoo()
    s, r = LocalEngine.from_zoo(args.sender, zoo=zoo), LocalEngine.from_zoo(args.receiver, zoo=zoo)
    adapter = Adapter.load(args.adapter, sender_fingerprint=s.spec.fingerprint, receiver_fingerprint=r.spec.fingerprint)
    return s, r, adapter
