"""The constraint core (llamacy.structured) with both real vocabularies: grammars, masks, forced tokens, errors,
the mask in the sampler, and constrained greedy decoding with the real model producing valid JSON."""

from __future__ import annotations

import functools
import json

import jsonschema
import numpy as np
import pytest

from llamacy.errors import UsageError
from llamacy.gguf import GGUFFile
from llamacy.sampling import Sampler, SamplingParams
from llamacy.structured import (
    Constraint,
    gbnf_grammar,
    json_object_grammar,
    json_schema_grammar,
    next_tokens,
    regex_grammar,
    request_grammar,
    response_format_grammar,
)
from llamacy.tokenizer import Tokenizer


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request, default_model_path, gemma_model_path) -> Tokenizer:
    path = default_model_path if request.param == "smollm2" else gemma_model_path
    return Tokenizer.from_metadata(GGUFFile(path).metadata)


def _run(c: Constraint, tok: Tokenizer, text: str) -> bool:
    """Feed text's tokens, checking each is in the mask first; True if all fit."""
    for t in tok.encode(text):
        if not c.allowed()[t]:
            return False
        c.accept(t)
    return True


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_schema_accepts_valid_and_masks_invalid(tokenizer):
    g = json_schema_grammar(PERSON)
    c = Constraint(g, tokenizer)
    assert _run(c, tokenizer, '{"name": "Ann", "age": 31}')
    assert c.done and c.accepting
    # The age bound and the closed object are enforced token by token.
    assert not _run(Constraint(g, tokenizer), tokenizer, '{"name": "Ann", "age": 151}')
    assert not _run(Constraint(g, tokenizer), tokenizer, '{"name": "Ann", "x": 1}')
    # Optional properties stay optional.
    c = Constraint(g, tokenizer)
    assert _run(c, tokenizer, '{"name": "Bo"}') and c.done


def test_mask_shape_eos_and_padding(tokenizer):
    c = Constraint(json_object_grammar(), tokenizer, n_logits=tokenizer.n_vocab + 7)
    m = c.allowed()
    assert m.dtype == np.bool_ and m.shape == (tokenizer.n_vocab + 7,)
    assert not m[tokenizer.n_vocab :].any()  # padding rows of the output layer are never allowed
    assert not any(m[i] for i in tokenizer.eot_ids)  # nothing written yet: the end is not allowed
    assert _run(c, tokenizer, '{"a": 1')
    assert not c.done and not c.accepting
    assert _run(c, tokenizer, "}")
    assert c.done  # a closed object ends the grammar: generation can stop without sampling an end token


def test_whitespace_is_bounded_and_no_fences(tokenizer):
    g = json_object_grammar()
    assert _run(Constraint(g, tokenizer), tokenizer, '{\n  "a": [1, 2]\n}')
    assert not _run(Constraint(g, tokenizer), tokenizer, '{\n\n\n"a": 1}')  # newlines cannot repeat
    assert not _run(Constraint(g, tokenizer), tokenizer, '{          "a": 1}')
    assert not _run(Constraint(g, tokenizer), tokenizer, '```json\n{"a": 1}')
    assert not _run(Constraint(g, tokenizer), tokenizer, ' {"a": 1}')


def test_forced_tokens(tokenizer):
    schema = {"type": "object", "properties": {"temperature_celsius": {"type": "number"}}, "required": ["temperature_celsius"], "additionalProperties": False}  # fmt: skip
    c = Constraint(json_schema_grammar(schema), tokenizer)
    assert _run(c, tokenizer, '{"')
    forced = c.forced()
    assert tokenizer.decode(forced).startswith("temperature_celsius")
    c.accept_all(forced)
    assert not c.done


def test_gbnf_and_regex(tokenizer):
    g = gbnf_grammar('root ::= "answer: " ("yes" | "no")')
    c = Constraint(g, tokenizer)
    assert _run(c, tokenizer, "answer: no") and c.accepting
    assert not _run(Constraint(g, tokenizer), tokenizer, "answer: maybe")
    c = Constraint(regex_grammar(r"[0-9]{3}-[0-9]{4}"), tokenizer)
    assert _run(c, tokenizer, "555-1234") and c.done


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: json_schema_grammar({"type": "objekt"}), "Invalid type: objekt"),
        (lambda: json_schema_grammar({"not": {"type": "string"}}), 'Unimplemented keys: ["not"]'),
        (lambda: json_schema_grammar('{"type": '), "not valid JSON"),
        (lambda: json_schema_grammar([1]), "must be a JSON object"),
        (lambda: json_schema_grammar({"type": "integer", "minimum": 5, "maximum": 1}), "Unsatisfiable"),
        (lambda: json_schema_grammar({"$ref": "#/nope"}), "does not exist"),
        (lambda: gbnf_grammar('root ::= "a" | b'), "Rule 'b' not found"),
        (lambda: gbnf_grammar('root ::= "a" ('), "Expected ')'"),
        (lambda: gbnf_grammar(""), "non-empty"),
        (lambda: regex_grammar("a(b"), "unclosed group"),
        (lambda: response_format_grammar({"type": "xml"}), "response_format.type"),
        (lambda: response_format_grammar({"type": "json_schema"}), "json_schema must be an object"),
        (lambda: response_format_grammar({"type": "json_schema", "json_schema": {"schema": {}}}), "name"),
        (lambda: request_grammar(grammar='root ::= "a"', json_schema={}), "only one of"),
    ],
)
def test_bad_input_is_one_line_usage_error(call, message):
    with pytest.raises(UsageError) as e:
        call()
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_grammar_that_admits_nothing_is_bad_input(tokenizer):
    for g in (gbnf_grammar("root ::= x\nx ::= x"), json_schema_grammar({"$ref": "#"})):
        with pytest.raises(UsageError, match="nothing can be generated from it"):
            Constraint(g, tokenizer)


def test_response_format_variants():
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_object"}).source == "json_schema"
    strict = {"name": "p", "strict": True, "schema": PERSON}  # "age" optional although strict: honoured
    assert response_format_grammar({"type": "json_schema", "json_schema": strict}) is not None
    assert request_grammar(response_format={"type": "text"}, grammar='root ::= "x"').source == "gbnf"


def test_sampler_mask():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32)
    mask = np.zeros(1000, dtype=bool)
    mask[[3, 500, 999]] = True
    greedy = Sampler(SamplingParams(temperature=0), 1000)
    assert greedy.sample(logits, mask=mask) == [3, 500, 999][int(np.argmax(logits[[3, 500, 999]]))]
    for params in (SamplingParams(seed=1), SamplingParams(seed=2, top_k=0, top_p=1.0, min_p=0.0),
                   SamplingParams(seed=3, top_k=0, top_p=0.5), SamplingParams(seed=4, repeat_penalty=1.3)):  # fmt: skip
        s = Sampler(params, 1000)
        picks = {s.sample(logits, [3, 3, 500], mask=mask) for _ in range(200)}
        assert picks <= {3, 500, 999}
    # Without a mask (or with an all-True one) the draw is unchanged.
    a, b = Sampler(SamplingParams(seed=7), 1000), Sampler(SamplingParams(seed=7), 1000)
    ones = np.ones(1000, dtype=bool)
    assert [a.sample(logits) for _ in range(50)] == [b.sample(logits, mask=ones) for _ in range(50)]
    with pytest.raises(ValueError, match="allows no token"):
        greedy.sample(logits, mask=np.zeros(1000, dtype=bool))
    with pytest.raises(ValueError, match="mask must be a bool array"):
        greedy.sample(logits, mask=np.ones(10, dtype=bool))


@pytest.fixture(scope="module")
def smollm(default_model_path):
    from llamacy import Llama

    return Llama(default_model_path, n_ctx=1024, n_threads=2)


def _generate(
    llm, constraint: Constraint, prompt: str, max_tokens: int = 120, mask_first: bool = False
) -> str:
    """Greedy constrained decoding as the engine does it: next_tokens, forced tokens evaluated as one batch.
    mask_first: every draw under the whole mask (the reference for next_tokens' unmasked first draw)."""
    sampler = Sampler(SamplingParams(temperature=0), llm.n_vocab)
    ids = llm.tokenize(prompt)
    llm.reset()
    logits = llm.model.eval(ids, logits="last")
    out: list[int] = []
    while not constraint.done and len(out) < max_tokens:
        history = ids + out
        draw = functools.partial(sampler.sample, logits, history)  # mask -> token
        if mask_first:
            draw = functools.partial(lambda mask, draw: draw(mask=constraint.allowed()), draw=draw)
        toks = next_tokens(constraint, lambda mask, draw=draw: draw(mask=mask), llm.tokenizer.eot_ids,
                           max_tokens - len(out))  # fmt: skip
        if not toks:
            break
        out += toks
        logits = llm.model.eval(toks, logits="last")
    return llm.detokenize(out)


def test_next_tokens_forced_and_budget(tokenizer):
    schema = {"type": "object", "properties": {"temperature_celsius": {"type": "number"}}, "required": ["temperature_celsius"]}  # fmt: skip
    never = lambda mask: pytest.fail("sampled although the grammar forces the tokens")  # noqa: E731
    c = Constraint(json_schema_grammar(schema), tokenizer)
    c.accept_all(tokenizer.encode('{"'))
    toks = next_tokens(c, never, tokenizer.eot_ids, 100)  # the only key is forced, without sampling
    assert tokenizer.decode(toks).startswith("temperature_celsius")
    c = Constraint(json_schema_grammar(schema), tokenizer)
    c.accept_all(tokenizer.encode('{"'))
    assert len(next_tokens(c, never, tokenizer.eot_ids, 1)) == 1  # the budget caps forced tokens
    # A sampled end token ends generation where the grammar is complete.
    c = Constraint(gbnf_grammar('root ::= "a" "b"*'), tokenizer)
    c.accept_all(tokenizer.encode("a"))
    eot = min(tokenizer.eot_ids)
    assert c.allowed()[eot]
    assert next_tokens(c, lambda mask: eot, tokenizer.eot_ids, 5) == []


@pytest.mark.slow
def test_real_model_output_validates(smollm):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"enum": ["France", "Spain", "Italy"]},
            "population": {"type": "integer", "minimum": 0},
            "districts": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
        },
        "required": ["city", "country", "population", "districts"],
        "additionalProperties": False,
    }  # fmt: skip
    prompt = "<|im_start|>user\nDescribe Paris as JSON.<|im_end|>\n<|im_start|>assistant\n"
    c = Constraint(json_schema_grammar(schema), smollm.tokenizer, n_logits=smollm.n_vocab)
    text = _generate(smollm, c, prompt, max_tokens=200)
    assert c.done, text
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_unmasked_first_draw_is_exact_under_greedy(smollm):
    """next_tokens checks an unmasked draw before computing a mask: greedy output is the same as masking
    every draw first."""
    prompt = "<|im_start|>user\nList three fruits as a JSON array.<|im_end|>\n<|im_start|>assistant\n"
    schema = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}
    fast = _generate(
        smollm, Constraint(json_schema_grammar(schema), smollm.tokenizer, smollm.n_vocab), prompt
    )
    full = _generate(
        smollm,
        Constraint(json_schema_grammar(schema), smollm.tokenizer, smollm.n_vocab),
        prompt,
        mask_first=True,
    )
    assert fast == full
    jsonschema.validate(json.loads(fast), schema)
