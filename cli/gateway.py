"""The gateway's commands: ``serve``, ``run`` (the main job), ``demo``, ``bench gateway``, ``db``."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from pydantic import SecretStr
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from gateway.jobs import STOPPING, Job
from gateway.settings import BootstrapSettings, Settings, load_settings

console = Console(width=None if sys.stdout.isatty() else 160)
ConfigOpt = Annotated[Path | None, typer.Option("--config", envvar="HETEROFOLD_CONFIG", help="YAML config file.")]
ENDED = ("done", "failed", "cancelled")  # fit job statuses that will not change again
db_app = typer.Typer(help="The registry database (Alembic).", no_args_is_help=True)


def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: config).")] = None,
) -> None:
    """Run the gateway with uvicorn, as configured (YAML plus HETEROFOLD_* environment)."""
    from gateway.app import create_app

    settings = load_settings(config)
    uvicorn.run(create_app(settings), host=host or settings.host, port=port or settings.port, log_level="info")


def run_main(config: Path | None = None) -> None:
    """The main job: the gateway on embedded defaults (local engines, embedded Redis, SQLite), with
    adapters fitted in the background for directions that have none."""
    settings = load_settings(config)
    admin_key = settings.auth.admin_key.get_secret_value() if settings.auth.admin_key else secrets.token_urlsafe(24)
    settings = settings.model_copy(
        update={
            "auth": settings.auth.model_copy(update={"admin_key": SecretStr(admin_key)}),
            "bootstrap": BootstrapSettings(**{**settings.bootstrap.model_dump(), "fit_missing": True}),
        }
    )
    console.print(f"Loading {len(settings.engines)} engines and starting the gateway (data in {settings.data_dir})...")
    # Ctrl-C: uvicorn shuts down, _run says what the fits came to, and the signal is re-raised,
    # reaching the loop before _run returns or not (a race): either way the job has stopped
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(settings, admin_key))
    console.print("Stopped.")


async def _run(settings: Settings, admin_key: str) -> None:
    from gateway.app import create_app

    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
            return
        await asyncio.sleep(0.1)
    base = f"http://{settings.host}:{settings.port}"
    _print_urls(settings, base, admin_key)
    jobs = list(app.state.services.jobs.jobs.values())  # the bootstrap's, not fits started later
    if not jobs:
        console.print(
            "Every direction already has an adapter, or a fit of it runs on another replica. Ctrl-C stops the gateway."
        )
        await serving
        return
    first = sum(not job.shadow for job in jobs)
    console.print(
        f"Fitting {first} adapter directions in the background (a few minutes each on a CPU). The gateway "
        "serves native prefill meanwhile; each direction starts transferring KV once its adapter is active."
        + (f" Then {len(jobs) - first} more fits in shadow ({'/'.join(sorted({j.method for j in jobs if j.shadow}))}; "
           "a distillation takes 10-15 minutes on a CPU): each replaces its direction's active version once it "
           "beats it on paired live requests." if first < len(jobs) else "")
    )  # fmt: skip
    said = False
    try:
        await _progress(jobs, serving)
        _say(jobs, "" if serving.done() or server.should_exit else " Ctrl-C stops the gateway.")
        said = True
        await serving
    finally:  # also when Ctrl-C cancels this task: say what the fits came to, never more
        if not said:
            _say(jobs, "")
        if serving.done() and not serving.cancelled():
            serving.exception()  # uvicorn re-raises Ctrl-C in its task: retrieved, not "never retrieved"


def _say(jobs: Sequence[Job], tail: str) -> None:
    ok = all(job.status == "done" for job in jobs)
    console.print(fit_summary(jobs) + tail, style=None if ok else "yellow", markup=False)


def _print_urls(settings: Settings, base: str, admin_key: str) -> None:
    table = Table(title="HeteroFold Gateway", show_header=False)
    for label, url in (
        ("dashboard", f"{base}/dashboard  (sign in with the admin key to change adapters)"),
        ("chat (OpenAI)", f"{base}/v1  (roles: {', '.join(settings.roles)})"),
        ("one role", f"{base}/v1/agents/<role>/chat/completions"),
        ("API docs", f"{base}/docs"),
        ("metrics", f"{base}/metrics"),
        ("health", f"{base}/health/ready"),
        ("admin", f"{base}/admin/adapters  (Authorization: Bearer {admin_key})"),
    ):
        table.add_row(label, url)
    console.print(table)
    if not settings.auth.client_keys:
        console.print("[yellow]No client keys configured: the chat API is open to anyone who can reach it.[/yellow]")
    console.print(f"Try: heterofold demo --url {base}")


def fit_summary(jobs: Sequence[Job]) -> str:
    """What the bootstrap fits came to: how many adapters are active, each failure with its error,
    and how many had not finished (the gateway stopped first)."""
    first = [job for job in jobs if not job.shadow]
    second = [job for job in jobs if job.shadow]
    stopped = [job for job in jobs if job.status == "failed" and job.error == f"FitCancelled: {STOPPING}"]
    parts = [f"{sum(job.status == 'done' for job in first)} of {len(first)} adapters fitted and active"]
    if second:
        methods = "/".join(sorted({job.method for job in second}))
        parts.append(f"{sum(job.status == 'done' for job in second)} of {len(second)} {methods} fits in shadow "
                     "(each replaces the active version if it beats it on live requests)")  # fmt: skip
    parts += [f"{_name(job)} failed: {job.error}" for job in jobs if job.status == "failed" and job not in stopped]
    parts += [f"{_name(job)} cancelled" for job in jobs if job.status == "cancelled"]
    unfinished = sum(job.status not in ENDED for job in jobs) + len(stopped)  # a stop is no failure of the fit
    if unfinished:
        parts.append(f"{unfinished} not finished")
    return "; ".join(part.rstrip(".") for part in parts) + "."


def _name(job: Job) -> str:
    return f"{job.sender} -> {job.receiver}" + (f" ({job.method}, shadow)" if job.shadow else "")


async def _progress(jobs: Sequence[Job], serving: asyncio.Task[None]) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bars:
        ids: dict[str, TaskID] = {}
        while not serving.done():
            for job in jobs:
                status = "stopped" if job.error == f"FitCancelled: {STOPPING}" else job.status
                state = f"{status} {job.stage} {job.done}/{job.total}"
                if job.id not in ids:
                    ids[job.id] = bars.add_task(_name(job), total=1.0, state=state)
                finished = job.status in ENDED
                bars.update(ids[job.id], completed=1.0 if finished else job.view()["progress"], state=state)
            if all(job.status in ENDED for job in jobs):
                return
            await asyncio.sleep(0.5)


@db_app.command("upgrade")
def db_upgrade(
    config: ConfigOpt = None,
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Migrate the registry up (compose runs this before the gateway)."""
    from gateway.registry import db

    settings = load_settings(config)
    db.upgrade(settings.registry_url, revision)
    console.print(f"registry at {revision}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, or `base`.")], config: ConfigOpt = None
) -> None:
    """Migrate the registry down."""
    from gateway.registry import db

    db.downgrade(load_settings(config).registry_url, revision)
    console.print(f"registry at {revision}")
