"""Probes and discovery: /health (process up), /ready (model loaded, engine working), /metrics, models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from cosyserve import __version__
from cosyserve.api.deps import CurrentPrincipal, get_service
from cosyserve.api.errors import envelope
from cosyserve.api.schemas import ERRORS, ModelCard, ModelList
from cosyserve.build_info import source_digest
from cosyserve.errors import ModelNotFound

router = APIRouter(tags=["health"])
# Names OpenAI clients send as `model`; all reach the one loaded model.
MODEL_ALIASES = ("cosyvoice3", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


@router.get("/health", summary="Liveness: the process is up")
def health(request: Request) -> dict[str, Any]:
    service = get_service(request)
    return {
        "status": "ok",
        "version": __version__,
        "source": source_digest(),  # which code exactly (`build_info`): the release number names many
        "uptime_s": round(service.uptime_s, 1),
        "model_state": service.model_state,
    }


@router.get(
    "/ready", summary="Readiness: the model is loaded and the engine works", responses={503: ERRORS[503]}
)
def ready(request: Request) -> Response:
    status = get_service(request).readiness()
    if status["ready"]:
        return JSONResponse(status)
    response = envelope(503, "not_ready", status["reason"] or "not ready", {"Retry-After": "5"})
    return response


@router.get("/metrics", summary="Prometheus metrics (all named cosyserve_*)", response_class=Response)
def metrics(request: Request) -> Response:
    body, content_type = get_service(request).metrics.render()
    return Response(body, media_type=content_type)


@router.get("/v1/models", response_model=ModelList, responses=ERRORS, tags=["openai"], summary="Models")
def models(request: Request, _: CurrentPrincipal) -> ModelList:
    return ModelList(data=_model_cards(request))


@router.get(
    "/v1/models/{model_id:path}",
    response_model=ModelCard,
    responses=ERRORS,
    tags=["openai"],
    summary="One model (OpenAI SDKs' models.retrieve)",
)
def model(model_id: str, request: Request, _: CurrentPrincipal) -> ModelCard:
    for card in _model_cards(request):
        if card.id == model_id:
            return card
    known = ", ".join(card.id for card in _model_cards(request))
    raise ModelNotFound(f"no model {model_id!r} here: GET /v1/models lists them ({known})")


def _model_cards(request: Request) -> list[ModelCard]:
    service = get_service(request)
    created = int(service.started_at)
    names = list(MODEL_ALIASES)
    path = service.backend.model_info.get("model_path")
    if path:
        names.append(path.rstrip("/").rsplit("/", 1)[-1])
    return [ModelCard(id=name, created=created) for name in dict.fromkeys(names)]
