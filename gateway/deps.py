"""Typed dependencies. Each hands out one object the lifespan built; tests swap them with
``app.dependency_overrides[get_x] = ...``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.auth import KeyRing
from gateway.chat import ChatService
from gateway.engine_pool import EnginePool
from gateway.jobs import FitJobs
from gateway.metrics import Metrics
from gateway.registry.db import Database
from gateway.resolver import AdapterResolver
from gateway.services import Services
from gateway.settings import Settings
from store.kv_store import KVStore


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> Settings:
    return services.settings


def get_chat(services: ServicesDep) -> ChatService:
    return services.chat


def get_keys(services: ServicesDep) -> KeyRing:
    return services.keys


def get_db(services: ServicesDep) -> Database:
    return services.db


def get_pool(services: ServicesDep) -> EnginePool:
    return services.pool


def get_store(services: ServicesDep) -> KVStore:
    return services.store


def get_metrics(services: ServicesDep) -> Metrics:
    return services.metrics


def get_resolver(services: ServicesDep) -> AdapterResolver:
    return services.resolver


def get_jobs(services: ServicesDep) -> FitJobs:
    return services.jobs


SettingsDep = Annotated[Settings, Depends(get_settings)]
ChatDep = Annotated[ChatService, Depends(get_chat)]
KeysDep = Annotated[KeyRing, Depends(get_keys)]
DbDep = Annotated[Database, Depends(get_db)]
PoolDep = Annotated[EnginePool, Depends(get_pool)]
StoreDep = Annotated[KVStore, Depends(get_store)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
ResolverDep = Annotated[AdapterResolver, Depends(get_resolver)]
JobsDep = Annotated[FitJobs, Depends(get_jobs)]
Authorization = Annotated[str | None, Header()]


def client_tenant(keys: KeysDep, authorization: Authorization = None) -> str:
    """The caller's tenant salt; raises AuthError without a valid client key (unless the API is open)."""
    return keys.client(authorization)


def require_admin(keys: KeysDep, authorization: Authorization = None) -> None:
    keys.admin(authorization)


TenantDep = Annotated[str, Depends(client_tenant)]
AdminDep = Depends(require_admin)
