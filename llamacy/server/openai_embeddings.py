"""OpenAI's POST /v1/embeddings: a string, a list of strings, a list of token ids or a list of such lists;
vectors as floats or base64 (little-endian float32, what the openai client asks for by default); unit
length; usage in prompt tokens. Errors in OpenAI's shape (the app's handlers)."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import llamacy.server.embeddings as embeddings
import llamacy.server.generation as gen
from llamacy.server.errors import APIError
from llamacy.server.schemas import parse
from llamacy.server.state import state_of

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    def unsupported(self) -> None:
        inputs = self.inputs()
        if not inputs:
            raise APIError(400, "input must not be empty", "invalid_value", "input")
        if len(inputs) > MAX_INPUTS:
            raise APIError(400, f"at most {MAX_INPUTS} inputs per request", "invalid_value", "input")
        for i, x in enumerate(inputs):
            if len(x) == 0:
                raise APIError(400, f"input {i} is empty", "invalid_value", "input")

    def inputs(self) -> list[str] | list[list[int]]:
        x = self.input
        if isinstance(x, str):
            return [x]
        if x and all(isinstance(t, int) for t in x):
            return [x]  # type: ignore[list-item]  # one input as token ids
        return x  # type: ignore[return-value]


def _encode(vector: Any, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def create_embeddings(request: Request) -> JSONResponse:
    body: EmbeddingRequest = parse(EmbeddingRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    embeddings.check_dimensions(served, body.dimensions)
    token_lists = [
        x if isinstance(x, list) else await gen.encode_text(served, x)  # prompts' tokenization, BOS included
        for x in body.inputs()
    ]
    out = await embeddings.embed(served, token_lists, dimensions=body.dimensions)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(out.vectors)
            ],
            "model": served.name,
            "usage": {"prompt_tokens": out.tokens, "total_tokens": out.tokens},
        }
    )


ROUTES = [Route("/v1/embeddings", create_embeddings, methods=["POST"])]
