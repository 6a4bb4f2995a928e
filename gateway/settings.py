"""The gateway's one configuration record: a YAML file, then ``HETEROFOLD_*`` environment overrides.

    HETEROFOLD_CONFIG=config/heterofold.yaml            which file (else the built-in defaults below)
    HETEROFOLD_ROLES__PLANNER__ENGINE=smollm2           nested keys use ``__``
    HETEROFOLD_AUTH__CLIENT_KEYS='["sk-a","sk-b"]'      lists and maps as JSON
    HETEROFOLD_DATABASE_URL=postgresql+psycopg://...    the registry (default: SQLite under data_dir)

The environment wins over the file, and the file over the defaults. The defaults run three roles on
the three zoo models: planner on qwen2.5-coder-0.5b-instruct, executor on smollm2-135m-instruct,
summarizer on gemma3-270m. Each component copies the fields it uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from engines.selectors import make_selector
from store.config import GiB, StoreConfig
from store.lease import data_dir_node

if TYPE_CHECKING:
    from gateway.registry.versions import Pairs

CONFIG_ENV = "HETEROFOLD_CONFIG"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSettings(_Section):
    """One inference engine. ``local`` runs a zoo model in this process; ``sglang`` is a running
    SGLang server at ``url`` (engines/sglang.py), whose tokenizer and config are read from
    ``model_dir``, and whose HiCache pages live in ``hicache_redis_url`` under ``hicache_namespace``
    (the same values as in the server's ``--hicache-storage-backend-extra-config``)."""

    kind: Literal["local", "sglang"] = "local"
    model: str  # a zoo model name (local), or the served model's display name (sglang)
    url: str | None = None  # sglang: the server's base URL
    model_dir: Path | None = None  # sglang: a local folder with the served model's tokenizer and config.json
    template: Literal["chatml", "plain"] = "chatml"  # sglang: how prompts are rendered
    fingerprint: str | None = None  # sglang: the model's identity (default: from its config and path)
    hicache_redis_url: str | None = None  # sglang: the page store; None: no KV import or export
    hicache_namespace: str | None = None  # sglang: default the engine's name
    export_wait_s: float = Field(default=2.0, ge=0.0)  # sglang: how long an export waits for write-through
    device: str | None = None  # None: CUDA when present, else CPU
    queue_capacity: int = Field(default=8, ge=1)  # running plus waiting requests; beyond it: 429
    max_prompt_tokens: int = Field(default=8192, ge=1)
    max_tokens: int = Field(default=1024, ge=1)  # the most a request may ask to generate
    # The longest a request waits for the engine's next event (queueing and prefill before the
    # first token, then each token); beyond it the request ends with 504 and the engine stops it.
    timeout_s: float = Field(default=120.0, gt=0.0)

    @model_validator(mode="after")
    def _sglang_has_server(self) -> EngineSettings:
        if self.kind == "sglang" and (self.url is None or self.model_dir is None):
            raise ValueError(f"engine {self.model!r}: an sglang engine needs url and model_dir")
        return self


class GenerationDefaults(_Section):
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class TransferPolicy(_Section):
    """How a role's requests reuse KV made elsewhere. ``recompute_budget`` is the share of the
    shared context's tokens that ``selector`` (``engines/selectors.py``) chooses for the new
    message: recomputed natively (path ``transfer``) or quoted as text (``map_quote``, ``quote``).
    ``path`` names the cross-model path (gateway/hop.py); ``auto`` picks per hop, ``quote`` when
    the new message names the sentence that answers it or asks for one detail in other words,
    else ``transfer`` (``engines.selectors.auto_path``). Unset, on an engine that recomputes in
    place it is ``auto`` across families and ``transfer`` between roles on one model, and
    ``quote`` on one that cannot (SGLang).
    ``sender_selectors`` names another selector for hops from a given engine (by its key under
    ``engines``): how well a selector that reads the sender chooses depends on the sender.
    ``min_uncached_tokens`` is how long the prefix left after same-model reuse must be before a
    cross-model hop is worth its fixed cost."""

    prefix_reuse: bool = True  # same-model cached prefixes from the store
    store_turns: bool = True  # export each turn's KV into the store for the next hop
    transfer: bool = True  # cross-model transfer through the active adapter
    same_model: bool = True  # between roles on one model: the identity adapter (RoPE re-applied)
    recompute_budget: float = Field(default=0.02, ge=0.0, le=1.0)  # BENCHMARKS.md, "The served budget"
    selector: str = "lexical-hop|meaning"  # BENCHMARKS.md, "Which tokens to read"
    sender_selectors: dict[str, str] = Field(default_factory=dict)  # sender engine -> selector for its hops
    path: Literal["transfer", "map_quote", "quote", "auto"] | None = None
    min_uncached_tokens: int = Field(default=64, ge=1)

    @field_validator("selector")
    @classmethod
    def _known_selector(cls, name: str) -> str:
        make_selector(name)  # ValueError names the selectors there are
        return name

    @field_validator("sender_selectors")
    @classmethod
    def _known_selectors(cls, names: dict[str, str]) -> dict[str, str]:
        for name in names.values():
            make_selector(name)
        return names

    def selector_for(self, sender: str) -> str:
        """The selector's name for a hop from engine ``sender``."""
        return self.sender_selectors.get(sender, self.selector)


class RoleSettings(_Section):
    engine: str
    description: str = ""
    system_prompt: str = ""
    generation: GenerationDefaults = GenerationDefaults()
    tail_window: int = Field(default=16, ge=0)  # W: the last W transferred tokens are recomputed natively
    policy: TransferPolicy = TransferPolicy()


class AuthSettings(_Section):
    """Bearer keys. No client keys: the chat API is open (the CLI says so). No admin key: the admin
    API is closed. Keys are hashed when loaded and never kept or logged in clear."""

    client_keys: list[SecretStr] = []
    admin_key: SecretStr | None = None


class LimitsSettings(_Section):
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_messages: int = Field(default=256, ge=1)


class StoreSettings(_Section):
    redis_url: str | None = None  # None: the embedded redis-server under data_dir
    node: str | None = None  # None: the data directory's own (``store/lease.py: data_dir_node``)
    node_lease_s: float = Field(default=15.0, gt=0.0)  # a killed replica's node is free again after this
    page_size: int = Field(default=16, ge=1)
    cpu_budget_bytes: int = Field(default=2 * GiB, ge=0)
    ssd_budget_bytes: int = Field(default=16 * GiB, ge=0)
    conversation_ttl_s: int = Field(default=24 * 3600, ge=1)


class ShadowSettings(_Section):
    """Shadow evaluation: a sampled share of transferred requests re-run natively off the hot path."""

    sample_rate: float = Field(default=0.05, ge=0.0, le=1.0)  # of transferred requests (active adapters)
    shadow_rate: float = Field(default=0.05, ge=0.0, le=1.0)  # of eligible requests, for shadow-status adapters
    answer_tokens: int = Field(default=16, ge=1)  # teacher-forced tokens of top-1 agreement
    drift_kl_threshold: float = Field(default=0.5, gt=0.0)  # mean first-token KL (nats) that raises an alert
    window: int = Field(default=50, ge=1)  # recent samples the mean is taken over
    min_samples: int = Field(default=5, ge=1)
    auto_rollback: bool = False
    auto_promote: bool = True  # a shadow version that beats the active one on paired requests replaces it
    promote_min_pairs: int = Field(default=20, ge=1)  # paired requests (within ``window``) before deciding
    promote_margin: float = Field(default=0.02, ge=0.0)  # nats of mean answer KL below the active version's

    def drifted(self, samples: int, mean_kl: float) -> bool:
        """The drift alert's condition: at least ``min_samples`` samples, mean KL over the threshold."""
        return samples >= self.min_samples and mean_kl > self.drift_kl_threshold

    def promotes(self, pairs: Pairs) -> bool:
        """Auto-promotion's condition on a shadow version's pairs with the active version: at least
        ``promote_min_pairs``, a mean answer KL at least ``promote_margin`` below the active's, and
        the lower KL on more than half of the requests."""
        return (pairs.samples >= self.promote_min_pairs and pairs.kl <= pairs.baseline_kl - self.promote_margin
                and 2 * pairs.wins > pairs.samples)  # fmt: skip


class DistillSettings(_Section):
    """How a ``distilled`` fit job (bootstrap or admin) distils the KV Ridge map it fits first:
    ``docs`` stdlib contexts, ``steps`` gradient steps of Adam at ``lr`` with each step's gradient
    norm clipped to ``clip`` (none: unclipped), for the transfer ``path`` (``recompute``: the chosen
    tokens native in place, as ``transfer`` hops serve them; ``quote``: the whole context mapped and
    the chosen spans quoted after it, as ``map_quote`` hops serve them). ``token_rank`` > 0 starts it
    from a KV Ridge map that also reads the receiver's own tokens (``fit --token-rank``), fitted in
    the job, instead of the direction's active KV Ridge map (BENCHMARKS.md, "The distilled map
    started from the token map")."""

    docs: int = Field(default=16, ge=2)
    steps: int = Field(default=200, ge=1)
    path: Literal["recompute", "quote"] = "quote"
    lr: float = Field(default=1e-3, gt=0.0)
    clip: float | None = Field(default=1.0, gt=0.0)
    token_rank: int = Field(default=0, ge=0)


class BootstrapSettings(_Section):
    """Adapters fitted in background jobs at start for directions that have none (``heterofold run``).
    ``fit_retries`` applies to every fit job, admin-started ones too: a fit that raises runs again
    after ``fit_retry_backoff_s``, doubled before each further attempt; ``distill`` too."""

    fit_missing: bool = False
    method: Literal["heterofold", "kv-ridge", "distilled"] = "kv-ridge"
    # a second fit per direction, after every first one, registered in shadow: promoted if it beats the
    # active version on paired live requests (``shadow.auto_promote``); None: no second stage
    then: Literal["heterofold", "kv-ridge", "distilled"] | None = "distilled"
    docs: int = Field(default=8, ge=2)
    max_tokens: int = Field(default=512, ge=64)
    fit_retries: int = Field(default=2, ge=0)  # attempts after the first; then a fit.failed alert
    fit_retry_backoff_s: float = Field(default=5.0, ge=0.0)
    distill: DistillSettings = DistillSettings()


class DashboardSettings(_Section):
    """The web dashboard under ``/dashboard`` (``dashboard/``)."""

    enabled: bool = True
    sample_interval_s: float = Field(default=5.0, gt=0.0)  # tier memory is sampled this often
    history: int = Field(default=720, ge=2)  # tier samples kept (an hour at 5 s)
    requests: int = Field(default=5000, ge=1)  # the newest requests the per-route view is computed over
    requests_kept: int = Field(default=50_000, ge=1)  # rows the request log keeps
    alert_window_s: float = Field(default=900.0, gt=0.0)  # an OOM or drift alert stays active this long
    poll_s: float = Field(default=0.5, gt=0.0)  # how often a live feed reads the event stream
    stream_s: float = Field(default=15.0, gt=0.0)  # a live feed's connection ends then; the browser reconnects
    session_ttl_s: int = Field(default=12 * 3600, ge=60)  # an admin sign-in lasts this long


def _default_engines() -> dict[str, EngineSettings]:
    names = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m")
    return {n: EngineSettings(model=n) for n in names}


QWEN = "qwen2.5-coder-0.5b-instruct"
# From a qwen2.5 sender the BM25 + attention union answered more at the 2% budget than the served
# fallback, on both directions measured (into smollm2 and gemma3; BENCHMARKS.md, "Does the better
# choice answer better?"): qwen2.5's attention finds the second sentence of a chain, which the
# fallback's first hop crowds out. The union costs the sender's attention pass on every hop.
FROM_QWEN = {QWEN: "sender-attention+lexical"}


def _default_roles() -> dict[str, RoleSettings]:
    return {
        "planner": RoleSettings(
            engine=QWEN,
            description="Breaks the task into steps.",
            system_prompt="You are the planner. Read the context and write a short numbered plan.",
        ),
        "executor": RoleSettings(
            engine="smollm2-135m-instruct",
            description="Carries out the plan.",
            system_prompt="You are the executor. Follow the plan and answer from the context.",
            policy=TransferPolicy(sender_selectors=dict(FROM_QWEN)),
        ),
        "summarizer": RoleSettings(
            engine="gemma3-270m",
            description="Summarizes the conversation.",
            system_prompt="Summarize the conversation in two sentences.",
            generation=GenerationDefaults(max_tokens=128),
            policy=TransferPolicy(sender_selectors=dict(FROM_QWEN)),
        ),
    }


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HETEROFOLD_", env_nested_delimiter="__", extra="forbid")

    data_dir: Path = Path.home() / ".local" / "share" / "heterofold"
    cache_dir: Path | None = None  # the zoo cache (default ~/.cache/heterofold)
    artifacts_dir: Path | None = None  # adapter artifacts (default <data_dir>/adapters); shared storage for N replicas
    database_url: str | None = None  # None: sqlite:///<data_dir>/registry.db
    migrate_on_start: bool = True  # run Alembic to head at start (compose runs it as a step instead)
    registry_retry_s: float = Field(default=5.0, gt=0.0)  # the registry unreachable at start: retried this often
    host: str = "127.0.0.1"
    port: int = 8000
    engines: dict[str, EngineSettings] = Field(default_factory=_default_engines)
    roles: dict[str, RoleSettings] = Field(default_factory=_default_roles)
    auth: AuthSettings = AuthSettings()
    limits: LimitsSettings = LimitsSettings()
    store: StoreSettings = StoreSettings()
    shadow: ShadowSettings = ShadowSettings()
    bootstrap: BootstrapSettings = BootstrapSettings()
    dashboard: DashboardSettings = DashboardSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings  # the file's values come in as init values: env wins

    @field_validator("data_dir", "cache_dir", "artifacts_dir")
    @classmethod
    def _expand(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()

    @model_validator(mode="after")
    def _roles_name_engines(self) -> Settings:
        for name, role in self.roles.items():
            if role.engine not in self.engines:
                raise ValueError(f"role {name!r} names engine {role.engine!r}, not one of {sorted(self.engines)}")
            unknown = sorted(set(role.policy.sender_selectors) - set(self.engines))
            if unknown:
                raise ValueError(
                    f"role {name!r}: policy.sender_selectors names engines {unknown}, not among {sorted(self.engines)}"
                )
        if not self.roles:
            raise ValueError("the config names no roles")
        return self

    @property
    def registry_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'registry.db'}"

    @property
    def adapters_dir(self) -> Path:
        """Where fitted and uploaded artifacts are written; the registry stores their paths, so
        every replica that serves a version must be able to read this folder."""
        return self.artifacts_dir or self.data_dir / "adapters"

    def store_config(self) -> StoreConfig:
        s = self.store
        return StoreConfig(
            data_dir=self.data_dir / "store",
            redis_url=s.redis_url,
            node=s.node or data_dir_node(self.data_dir),
            node_lease_s=s.node_lease_s,
            page_size=s.page_size,
            cpu_budget=s.cpu_budget_bytes,
            ssd_budget=s.ssd_budget_bytes,
        )


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (or ``$HETEROFOLD_CONFIG``), then the environment; ``overrides``
    (top-level fields, for the CLI and tests) replace whole fields last."""
    path = path or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(path.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a mapping")
        data = loaded
    settings = Settings(**data)
    return settings.model_copy(update=overrides) if overrides else settings
