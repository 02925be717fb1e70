"""Embeddings over HTTP: OpenAI's /v1/embeddings with the openai client, Ollama's /api/embed and
/api/embeddings with the ollama client, on the real server. Vectors are checked against Llama.embed."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")

from tests.test_server import running_server  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from llamacy import Llama
    from tests.model_factory import write_tiny_model

    return Llama(write_tiny_model(tmp_path_factory.mktemp("embed") / "tiny.gguf"), n_ctx=128, n_threads=1)


@pytest.fixture(scope="module")
def server(llm):
    with running_server(llm, parallel=2) as (srv, _sched):
        yield srv


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def client(server):
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def close(a, b) -> bool:
    return np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=1e-6)


def unit(v) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


# ---- OpenAI ------------------------------------------------------------------------------------------


def test_openai_embeddings(oai, llm):
    want = llm.embed(TEXTS)
    r = oai.embeddings.create(model="tiny", input=TEXTS)  # the client asks for base64 unless told
    assert r.object == "list" and r.model == "tiny" and [d.index for d in r.data] == [0, 1]
    assert all(close(d.embedding, w) for d, w in zip(r.data, want.vectors, strict=True))
    assert r.usage.prompt_tokens == r.usage.total_tokens == want.n_tokens
    f = oai.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in f.data] == [d.embedding for d in r.data]  # float32 either way
    one = oai.embeddings.create(model="tiny", input=TEXTS[0])
    assert len(one.data) == 1 and close(one.data[0].embedding, want.vectors[0])
    # Token ids: one input, or several.
    ids = [llm.tokenize(t) for t in TEXTS]
    r = oai.embeddings.create(model="tiny", input=ids[0])
    assert len(r.data) == 1 and close(r.data[0].embedding, want.vectors[0])
    r = oai.embeddings.create(model="tiny", input=ids)
    assert all(close(d.embedding, w) for d, w in zip(r.data, want.vectors, strict=True))
    assert r.usage.prompt_tokens == sum(len(x) for x in ids)
    # dimensions: the first d components, unit length again.
    r = oai.embeddings.create(model="tiny", input=TEXTS[0], dimensions=8)
    assert len(r.data[0].embedding) == 8 and close(r.data[0].embedding, unit(want.vectors[0][:8]))


def test_openai_embedding_errors(http, llm):
    def post(body: dict) -> httpx.Response:
        return http.post("/v1/embeddings", json={"model": "tiny", **body})

    for body, status, fragment in [
        ({"input": ""}, 400, "empty"),
        ({"input": []}, 400, "empty"),
        ({"input": ["a", ""]}, 400, "input 1"),
        ({"input": "a", "dimensions": llm.config.n_embd + 1}, 400, "dimensions"),
        ({"input": "a", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": [10**9]}, 400, "vocabulary"),
        ({"input": "word " * 200}, 400, "context"),
        ({"input": 5}, 400, "input"),
    ]:
        r = post(body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "code"} and fragment in err["message"], (body, err)


# ---- Ollama ------------------------------------------------------------------------------------------


def test_ollama_embed(client, llm, http):
    want = llm.embed(TEXTS)
    r = client.embed(model="tiny", input=TEXTS)
    assert r.model == "tiny:latest" and len(r.embeddings) == 2
    assert all(close(e, w) for e, w in zip(r.embeddings, want.vectors, strict=True))
    assert r.prompt_eval_count == want.n_tokens and isinstance(r.total_duration, int)
    one = client.embed(model="tiny", input=TEXTS[1])
    assert len(one.embeddings) == 1 and close(one.embeddings[0], want.vectors[1])
    small = client.embed(model="tiny", input=TEXTS[0], dimensions=16)
    assert close(small.embeddings[0], unit(want.vectors[0][:16]))
    # An input longer than the context loses its end (Ollama's truncate, on by default) or is refused.
    long = "word " * 200
    ids = llm.tokenize(long)
    assert len(ids) > 128
    r = client.embed(model="tiny", input=long)
    assert close(r.embeddings[0], llm.embed(ids[:128]).vectors[0]) and r.prompt_eval_count == 128
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input=long, truncate=False)
    assert e.value.status_code == 400
    # No input: Ollama's "load the model" answer, no vectors.
    assert http.post("/api/embed", json={"model": "tiny"}).json() == {
        "model": "tiny:latest",
        "embeddings": [],
    }
    # One model served: any name is that model (a 404 with several: test_server.py).
    assert len(client.embed(model="nope", input="x").embeddings) == 1
    r = http.post("/api/embed", json={"model": "tiny", "input": ["a", ""]})
    assert r.status_code == 400 and list(r.json()) == ["error"]
    r = http.post("/api/embed", json={"model": "tiny", "input": "a", "options": {"temperature": "hot"}})
    assert r.status_code == 400 and "temperature" in r.json()["error"]


def test_ollama_embeddings_older_endpoint(client, llm, http):
    r = client.embeddings(model="tiny", prompt=TEXTS[0])
    # As Ollama's: the vector as the model makes it, not scaled to unit length.
    assert close(r.embedding, llm.embed(TEXTS[0], normalize=False).vectors[0])
    assert abs(np.linalg.norm(r.embedding) - 1) > 1e-3
    assert http.post("/api/embeddings", json={"model": "tiny", "prompt": ""}).json() == {"embedding": []}
    r = http.post("/api/embeddings", json={"prompt": "x"})
    assert r.status_code == 400 and r.json() == {"error": "model is required"}


# ---- the real model ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
def test_real_model_embeddings(default_model_path):
    from llamacy import Llama

    llm = Llama(default_model_path, n_ctx=256, n_threads=2)
    want = llm.embed(TEXTS)
    with running_server(llm, parallel=1) as (srv, _sched):
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        r = oai.embeddings.create(model="tiny", input=TEXTS)
        assert all(close(d.embedding, w) for d, w in zip(r.data, want.vectors, strict=True))
        assert len(r.data[0].embedding) == llm.config.n_embd
        e = ollama.Client(host=srv.url, timeout=300).embed(model="tiny", input=TEXTS)
        assert all(close(a, w) for a, w in zip(e.embeddings, want.vectors, strict=True))
