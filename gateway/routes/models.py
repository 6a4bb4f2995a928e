"""``GET /v1/models`` and ``GET /v1/models/{role}``: the roles, in the OpenAI model-list shape."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import PoolDep, SettingsDep, TenantDep
from gateway.errors import UnknownRole
from gateway.schemas import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["models"])


def _card(role: str, settings: SettingsDep, pool: PoolDep) -> ModelCard:
    cfg = settings.roles[role]
    spec = pool[cfg.engine].engine.spec
    return ModelCard(id=role, engine=cfg.engine, engine_model=spec.name, family=spec.family,
                     description=cfg.description)  # fmt: skip


@router.get("/models")
async def list_models(settings: SettingsDep, pool: PoolDep, _: TenantDep) -> ModelList:
    return ModelList(data=[_card(role, settings, pool) for role in settings.roles])


@router.get("/models/{role}")
async def get_model(role: str, settings: SettingsDep, pool: PoolDep, _: TenantDep) -> ModelCard:
    if role not in settings.roles:
        raise UnknownRole(f"no role {role!r}", param="model")
    return _card(role, settings, pool)
